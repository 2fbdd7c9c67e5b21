package bench

import (
	"fmt"
	"strings"
)

// Chart draws the RoCEv2 report: ib0 over RoCEv2 against both udp-pipes
// and wireguard-go per mode, with ib0/udp-pipe-offload and
// ib0/wireguard-go as the label of each ib0 bar.
func (r *RoCEv2Report) Chart() BarChart {
	c := BarChart{Title: fmt.Sprintf("ipoib bench --iperf --hca rocev2 (%d stream(s), %v per test)", r.Streams, r.Duration), YLabel: "Gbit/s"}
	ib, pipe, offl, wg := BarSeries{Name: "ib0 (RoCEv2)"}, BarSeries{Name: "udp-pipe"}, BarSeries{Name: "udp-pipe-offload"}, BarSeries{Name: "wireguard-go"}
	for _, cmp := range r.VsUDPPipe {
		c.Groups = append(c.Groups, cmp.Mode)
		ib.Values = append(ib.Values, cmp.IBGbps)
		pipe.Values = append(pipe.Values, cmp.UDPPipeGbps)
		offl.Values = append(offl.Values, cmp.UDPPipeOffloadGbps)
		wg.Values = append(wg.Values, cmp.WireGuardGoGbps)
		label := ratioLabel(cmp.RatioOffload, "udp-pipe-offload")
		if l := ratioLabel(cmp.RatioWireGuardGo, "wireguard-go"); l != "" {
			label = strings.TrimPrefix(label+", "+l, ", ")
		}
		c.Ratios = append(c.Ratios, label)
	}
	c.Series = []BarSeries{ib, pipe, offl, wg}
	return c
}
