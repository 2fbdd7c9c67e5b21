package bench

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"io"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// svgTexts parses an SVG as XML and returns its text elements.
func svgTexts(t *testing.T, b []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var texts []string
	inText, root := false, ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v", err)
		}
		switch v := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = v.Name.Local
			}
			inText = v.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, strings.TrimSpace(string(v)))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q", root)
	}
	return texts
}

func sampleInProcReport() *InProcReport {
	runs := func(g float64) []Result { return []Result{{Gbps: g - 1}, {Gbps: g}, {Gbps: g + 5}} }
	r := &InProcReport{Bytes: 256 << 20, Runs: 3, Rows: []InProcRow{
		{Link: LinkDirect, MTU: 65520, Runs: runs(20)},
		{Link: LinkIBConnected, MTU: 65520, Runs: runs(16)},
		{Link: LinkDirectGSO, MTU: 65520, Runs: runs(32)},
		{Link: LinkDirect, MTU: 4092, Runs: runs(6)},
		{Link: LinkIBDatagram, MTU: 4092, Runs: runs(3)},
		{Link: LinkDirectGSO, MTU: 4092, Runs: runs(12)},
	}}
	r.summarise()
	return r
}

func TestBenchPlotSVG(t *testing.T) {
	var b bytes.Buffer
	if err := sampleInProcReport().Chart().WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(svgTexts(t, b.Bytes()), "\n")
	for _, want := range []string{"direct link", "ib0", "connected, MTU 65520", "datagram, MTU 4092", "direct link, host GSO", "0.80 x direct, 0.50 x direct-gso", "0.50 x direct, 0.25 x direct-gso", "Gbit/s", "ib0 connected / datagram = 5.33"} {
		if !strings.Contains(joined, want) {
			t.Errorf("bench SVG lacks %q; texts:\n%s", want, joined)
		}
	}
}

func sampleSoakReport() *SoakReport {
	r := &SoakReport{Settings: SoakSettings{Hosts: 8, Duration: "3s"}, Violations: 2}
	for k := range 4 {
		v := uint64(0)
		if k >= 2 {
			v = 2
		}
		r.Timeline = append(r.Timeline, SoakSample{ElapsedSec: float64(k + 1), Live: 10 + k, Established: uint64(100 * (k + 1)),
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
	joined := strings.Join(svgTexts(t, b.Bytes()), "\n")
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
	if err := (&SoakReport{}).WritePlot(io.Discard); err == nil {
		t.Error("a report without a timeline plotted")
	}
}
