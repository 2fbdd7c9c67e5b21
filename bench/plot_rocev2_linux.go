package bench

import "fmt"

// Chart draws the RoCEv2 report: ib0 over RoCEv2 against both udp-pipes
// per mode, with ib0/udp-pipe-offload as the label of each ib0 bar.
func (r *RoCEv2Report) Chart() BarChart {
	c := BarChart{Title: fmt.Sprintf("ipoib bench --iperf --hca rocev2 (%d stream(s), %v per test)", r.Streams, r.Duration), YLabel: "Gbit/s"}
	ib, pipe, offl := BarSeries{Name: "ib0 (RoCEv2)"}, BarSeries{Name: "udp-pipe"}, BarSeries{Name: "udp-pipe-offload"}
	for _, cmp := range r.VsUDPPipe {
		c.Groups = append(c.Groups, cmp.Mode)
		ib.Values = append(ib.Values, cmp.IBGbps)
		pipe.Values = append(pipe.Values, cmp.UDPPipeGbps)
		offl.Values = append(offl.Values, cmp.UDPPipeOffloadGbps)
		c.Ratios = append(c.Ratios, ratioLabel(cmp.RatioOffload, "udp-pipe-offload"))
	}
	c.Series = []BarSeries{ib, pipe, offl}
	return c
}
