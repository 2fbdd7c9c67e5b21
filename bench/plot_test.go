package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

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
	joined := strings.Join(testutil.SVGTexts(t, b.Bytes()), "\n")
	for _, want := range []string{"direct link", "ib0", "connected, MTU 65520", "datagram, MTU 4092", "direct link, host GSO", "0.80 x direct, 0.50 x direct-gso", "0.50 x direct, 0.25 x direct-gso", "Gbit/s", "ib0 connected / datagram = 5.33"} {
		if !strings.Contains(joined, want) {
			t.Errorf("bench SVG lacks %q; texts:\n%s", want, joined)
		}
	}
}
