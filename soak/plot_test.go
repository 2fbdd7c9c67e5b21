package soak

import (
	"bytes"
	"image/png"
	"io"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func sampleSoakReport() *Report {
	r := &Report{Settings: Settings{Hosts: 8, Duration: "3s"}, Violations: 2}
	for k := range 4 {
		v := uint64(0)
		if k >= 2 {
			v = 2
		}
		r.Timeline = append(r.Timeline, Sample{ElapsedSec: float64(k + 1), Live: 10 + k, Established: uint64(100 * (k + 1)),
			Reaped: uint64(90 * (k + 1)), DeadDropped: uint64(5 * k), Violations: v})
	}
	return r
}

func TestSoakPlotSVGAndPNG(t *testing.T) {
	r := sampleSoakReport()
	var b bytes.Buffer
	if err := r.WritePlot(&b); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(testutil.SVGTexts(t, b.Bytes()), "\n")
	for _, want := range []string{"live connections", "established / s", "reaped / s", "dead-dropped / s", "violation", "FAIL", "seconds"} {
		if !strings.Contains(joined, want) {
			t.Errorf("soak SVG lacks %q; texts:\n%s", want, joined)
		}
	}
	// The same plot rendered as PNG decodes to an image of the size asked.
	p, err := r.plot()
	if err != nil {
		t.Fatal(err)
	}
	c := vgimg.New(4*vg.Inch, 2*vg.Inch)
	p.Draw(draw.New(c))
	var pb bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&pb); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&pb)
	if err != nil {
		t.Fatalf("PNG does not decode: %v", err)
	}
	if img.Bounds().Dx() < 100 || img.Bounds().Dy() < 50 {
		t.Fatalf("PNG of %v", img.Bounds())
	}
	if err := (&Report{}).WritePlot(io.Discard); err == nil {
		t.Error("a report without a timeline plotted")
	}
}
