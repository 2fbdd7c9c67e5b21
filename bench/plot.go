package bench

import (
	"fmt"
	"io"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// BarChart is a benchmark report as grouped bars for --plot: one group
// per MTU or mode, one bar per link in it, and the group's ratio as the
// label over its ib0 bar.
type BarChart struct {
	Title  string
	YLabel string
	Groups []string
	Series []BarSeries
	// Ratios label the bars of one series (usually ib0), per group; ""
	// for none.
	RatioSeries int
	Ratios      []string
}

// BarSeries is one link across the groups; a 0 value is a missing bar.
type BarSeries struct {
	Name   string
	Values []float64
}

// Chart draws the in-process report: per MTU, the direct link, the direct
// link with host GSO and ib0, with ib0's ratios to both as the label of
// each ib0 bar.
func (r *InProcReport) Chart() BarChart {
	c := BarChart{
		Title:       fmt.Sprintf("ipoib bench (in-process TCP, %d MiB, median of %d): ib0 connected / datagram = %.2f", r.Bytes>>20, r.Runs, r.ConnectedVsDatagram),
		YLabel:      "Gbit/s",
		RatioSeries: 2,
	}
	direct, directGSO, ib := BarSeries{Name: "direct link"}, BarSeries{Name: "direct link, host GSO"}, BarSeries{Name: "ib0"}
	at := func(link string, mtu int) float64 {
		for _, o := range r.Rows {
			if o.Link == link && o.MTU == mtu {
				return o.MedianGbps
			}
		}
		return 0
	}
	for _, row := range r.Rows {
		if row.Link == LinkDirect || row.Link == LinkDirectGSO {
			continue
		}
		mode, ratio, ratioGSO := "connected", r.ConnectedVsDirect, r.ConnectedVsDirectGSO
		if row.Link == LinkIBDatagram {
			mode, ratio, ratioGSO = "datagram", r.DatagramVsDirect, r.DatagramVsDirectGSO
		}
		c.Groups = append(c.Groups, fmt.Sprintf("%s, MTU %d", mode, row.MTU))
		ib.Values = append(ib.Values, row.MedianGbps)
		direct.Values = append(direct.Values, at(LinkDirect, row.MTU))
		directGSO.Values = append(directGSO.Values, at(LinkDirectGSO, row.MTU))
		label := ratioLabel(ratio, "direct")
		if l := ratioLabel(ratioGSO, "direct-gso"); l != "" {
			label = strings.TrimPrefix(label+", "+l, ", ")
		}
		c.Ratios = append(c.Ratios, label)
	}
	c.Series = []BarSeries{direct, directGSO, ib}
	return c
}

// Chart draws the iperf3 report: ib0, veth, tap-pipe and the offload
// tap-pipe per mode, with
// ib0/veth as the label of each ib0 bar.
func (r *IperfReport) Chart() BarChart {
	c := BarChart{Title: fmt.Sprintf("ipoib bench --iperf (%d stream(s), %v per test)", r.Streams, r.Duration), YLabel: "Gbit/s"}
	ib, veth, pipe := BarSeries{Name: "ib0"}, BarSeries{Name: "veth"}, BarSeries{Name: "tap-pipe"}
	pipeOffload := BarSeries{Name: "tap-pipe, offloads"}
	for _, cmp := range r.Comparisons {
		c.Groups = append(c.Groups, fmt.Sprintf("%s, MTU %d", cmp.Mode, cmp.MTU))
		ib.Values = append(ib.Values, cmp.IBGbps)
		veth.Values = append(veth.Values, cmp.VethGbps)
		pipe.Values = append(pipe.Values, cmp.TapPipeGbps)
		pipeOffload.Values = append(pipeOffload.Values, cmp.TapPipeOffloadGbps)
		c.Ratios = append(c.Ratios, ratioLabel(cmp.VsVeth, "veth"))
	}
	c.Series = []BarSeries{ib, veth, pipe, pipeOffload}
	return c
}

func ratioLabel(r float64, base string) string {
	if r == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f x %s", r, base)
}

// WriteSVG draws the chart as SVG.
func (c BarChart) WriteSVG(w io.Writer) error {
	p, err := c.plot()
	if err != nil {
		return err
	}
	return writeSVG(p, w, 8*vg.Inch, 4*vg.Inch)
}

func (c BarChart) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.Y.Label.Text = c.YLabel
	p.Y.Min = 0
	width := vg.Points(28)
	n := len(c.Series)
	for k, s := range c.Series {
		bars, err := plotter.NewBarChart(plotter.Values(s.Values), width)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", s.Name, err)
		}
		bars.LineStyle.Width = 0
		bars.Color = plotutil.Color(k)
		bars.Offset = vg.Length(float64(k)-float64(n-1)/2) * width
		p.Add(bars)
		p.Legend.Add(s.Name, bars)
		if k == c.RatioSeries && len(c.Ratios) > 0 {
			xys := make(plotter.XYs, len(s.Values))
			labels := make([]string, len(s.Values))
			for g, v := range s.Values {
				xys[g] = plotter.XY{X: float64(g), Y: v}
				if g < len(c.Ratios) {
					labels[g] = c.Ratios[g]
				}
			}
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return nil, fmt.Errorf("plot labels: %w", err)
			}
			l.Offset = vg.Point{X: bars.Offset - width/2, Y: vg.Points(3)}
			p.Add(l)
		}
	}
	p.NominalX(c.Groups...)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Max *= 1.35 // room for the labels and the legend
	return p, nil
}

func writeSVG(p *plot.Plot, w io.Writer, width, height vg.Length) error {
	wt, err := p.WriterTo(width, height, "svg")
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("plot: write: %w", err)
	}
	return nil
}
