package bench

import "fmt"

// Chart draws the RoCEv2 report: ib0 over RoCEv2 against the udp-pipe
// per mode, with ib0/udp-pipe as the label of each ib0 bar.
func (r *RoCEv2Report) Chart() BarChart {
	c := BarChart{Title: fmt.Sprintf("ipoib bench --iperf --hca rocev2 (%d stream(s), %v per test)", r.Streams, r.Duration), YLabel: "Gbit/s"}
	ib, pipe := BarSeries{Name: "ib0 (RoCEv2)"}, BarSeries{Name: "udp-pipe"}
	for _, cmp := range r.VsUDPPipe {
		c.Groups = append(c.Groups, cmp.Mode)
		ib.Values = append(ib.Values, cmp.IBGbps)
		pipe.Values = append(pipe.Values, cmp.UDPPipeGbps)
		c.Ratios = append(c.Ratios, ratioLabel(cmp.Ratio, "udp-pipe"))
	}
	c.Series = []BarSeries{ib, pipe}
	return c
}
