package bench

import (
	"fmt"
	"io"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
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

// SoakSample is the soak at one moment, for the report's timeline and
// --plot: gauges, and counters summed over every interface since start.
type SoakSample struct {
	ElapsedSec  float64 `json:"t_s"`
	Live        int     `json:"live"`
	Established uint64  `json:"established"`
	Reaped      uint64  `json:"reaped"`
	DeadDropped uint64  `json:"dead_dropped"`
	Violations  uint64  `json:"violations"`
}

// WritePlot draws the soak as a timeline: live connections, and
// established, reaped and dead-dropped per second, with every sample at
// which the violation count rose marked.
func (r *SoakReport) WritePlot(w io.Writer) error {
	p, err := r.plot()
	if err != nil {
		return err
	}
	return writeSVG(p, w, 8*vg.Inch, 4*vg.Inch)
}

func (r *SoakReport) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("ipoib soak: %d hosts, %v, %s", r.Settings.Hosts, r.Settings.Duration, verdict(r))
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "connections / per second"
	tl := r.Timeline
	if len(tl) == 0 {
		return nil, fmt.Errorf("soak plot: the report has no timeline")
	}
	live := make(plotter.XYs, len(tl))
	rates := [3]plotter.XYs{}
	var viol plotter.XYs
	for k, s := range tl {
		live[k] = plotter.XY{X: s.ElapsedSec, Y: float64(s.Live)}
		prev := SoakSample{}
		if k > 0 {
			prev = tl[k-1]
		}
		dt := s.ElapsedSec - prev.ElapsedSec
		if dt <= 0 {
			dt = 1
		}
		for i, v := range [3][2]uint64{{s.Established, prev.Established}, {s.Reaped, prev.Reaped}, {s.DeadDropped, prev.DeadDropped}} {
			rates[i] = append(rates[i], plotter.XY{X: s.ElapsedSec, Y: float64(v[0]-min(v[0], v[1])) / dt})
		}
		if s.Violations > prev.Violations {
			viol = append(viol, plotter.XY{X: s.ElapsedSec})
		}
	}
	names := []string{"live connections", "established / s", "reaped / s", "dead-dropped / s"}
	series := []plotter.XYs{live, rates[0], rates[1], rates[2]}
	top := 0.0
	for k, xys := range series {
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("soak plot %s: %w", names[k], err)
		}
		l.Color = plotutil.Color(k)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(names[k], l)
		for _, xy := range xys {
			top = max(top, xy.Y)
		}
	}
	if len(viol) > 0 {
		for i := range viol {
			viol[i].Y = top * 1.05
		}
		sc, err := plotter.NewScatter(viol)
		if err != nil {
			return nil, fmt.Errorf("soak plot violations: %w", err)
		}
		sc.GlyphStyle.Shape = draw.TriangleGlyph{}
		sc.GlyphStyle.Radius = vg.Points(4)
		sc.GlyphStyle.Color = plotutil.Color(3)
		p.Add(sc)
		p.Legend.Add("violation", sc)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = max(top*1.5, 1) // the legend sits above the lines
	return p, nil
}

func verdict(r *SoakReport) string {
	if r.Failed() {
		return "FAIL"
	}
	return "pass"
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

// WritePlotFile writes an SVG made by draw to path.
func WritePlotFile(path string, draw func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if err := draw(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}
