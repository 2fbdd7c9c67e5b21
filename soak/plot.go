package soak

import (
	"fmt"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Sample is the soak at one moment, for the report's timeline and
// --plot: gauges, and counters summed over every interface since start.
type Sample struct {
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
func (r *Report) WritePlot(w io.Writer) error {
	p, err := r.plot()
	if err != nil {
		return err
	}
	wt, err := p.WriterTo(8*vg.Inch, 4*vg.Inch, "svg")
	if err != nil {
		return fmt.Errorf("soak plot: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("soak plot: write: %w", err)
	}
	return nil
}

func (r *Report) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("ipoib soak: %d hosts, %v, %s", r.Settings.Hosts, r.Settings.Duration, r.Verdict())
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
		prev := Sample{}
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
