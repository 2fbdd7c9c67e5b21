package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/tap/netstack"
)

// TestRunInProcSuite runs the whole table small: six rows, each with its
// runs, medians and ratios consistent with them, progress lines for every
// transfer, and a table and JSON that carry the numbers.
func TestRunInProcSuite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var progress bytes.Buffer
	host := netstack.Config{GSO: true, TrustRXChecksums: true}
	rep, err := RunInProcSuite(ctx, InProcSuiteConfig{Bytes: 2 << 20, Runs: 2, Host: &host, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		link     string
		mtu      int
		offloads bool
	}{
		{LinkDirect, 65520, false}, {LinkIBConnected, 65520, false}, {LinkDirectGSO, 65520, true},
		{LinkDirect, 4092, false}, {LinkIBDatagram, 4092, false}, {LinkDirectGSO, 4092, true},
	}
	if len(rep.Rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rep.Rows), len(want))
	}
	for k, w := range want {
		row := rep.Rows[k]
		// Whether ib0 used offloads is the engine's business; the direct
		// rows are known.
		if row.Link != w.link || row.MTU != w.mtu || row.Link != LinkIBConnected && row.Link != LinkIBDatagram && row.Offloads != w.offloads || len(row.Runs) != 2 {
			t.Fatalf("row %d: %s/%d offloads %v with %d runs, want %s/%d offloads %v with 2", k, row.Link, row.MTU, row.Offloads, len(row.Runs), w.link, w.mtu, w.offloads)
		}
		for _, r := range row.Runs {
			if r.Bytes != 2<<20 || r.Gbps <= 0 {
				t.Fatalf("row %d: run %+v carried nothing", k, r)
			}
		}
		if m := (row.Runs[0].Gbps + row.Runs[1].Gbps) / 2; row.MedianGbps != m {
			t.Fatalf("row %d: median %v, want %v", k, row.MedianGbps, m)
		}
	}
	if !rep.TrustRXChecksums || !rep.GSO {
		t.Fatalf("host settings not reported: %+v", rep)
	}
	if got, w := rep.ConnectedVsDirect, rep.Rows[1].MedianGbps/rep.Rows[0].MedianGbps; got != w {
		t.Fatalf("connected/direct %v, want %v", got, w)
	}
	if got, w := rep.ConnectedVsDatagram, rep.Rows[1].MedianGbps/rep.Rows[4].MedianGbps; got != w {
		t.Fatalf("connected/datagram %v, want %v", got, w)
	}
	if got, w := rep.DatagramVsDirect, rep.Rows[4].MedianGbps/rep.Rows[3].MedianGbps; got != w {
		t.Fatalf("datagram/direct %v, want %v", got, w)
	}
	if got, w := rep.ConnectedVsDirectGSO, rep.Rows[1].MedianGbps/rep.Rows[2].MedianGbps; got != w {
		t.Fatalf("connected/direct-gso %v, want %v", got, w)
	}
	if got, w := rep.DatagramVsDirectGSO, rep.Rows[4].MedianGbps/rep.Rows[5].MedianGbps; got != w {
		t.Fatalf("datagram/direct-gso %v, want %v", got, w)
	}
	if n := strings.Count(progress.String(), "\n"); n != 12 {
		t.Fatalf("%d progress lines, want 12:\n%s", n, progress.String())
	}
	if !strings.Contains(progress.String(), "run 2/2  direct-gso") {
		t.Fatalf("progress lacks the last transfer:\n%s", progress.String())
	}

	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"direct  65520        no", "direct-gso   4092       yes", "ib0-datagram   4092", "connected/direct", "connected/datagram", "datagram/direct-gso", "median of 2", "gso=true trust_rx_checksums=true"} {
		if !strings.Contains(table.String(), s) {
			t.Fatalf("table lacks %q:\n%s", s, table.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back InProcReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.ConnectedVsDatagram != rep.ConnectedVsDatagram || len(back.Rows) != 6 || !back.Rows[5].Offloads || back.Rows[1].Runs[1].Bytes != 2<<20 {
		t.Fatalf("JSON round trip: %+v", back)
	}
}

func TestRunInProcSuiteRejectsNoBytes(t *testing.T) {
	if _, err := RunInProcSuite(context.Background(), InProcSuiteConfig{}); err == nil {
		t.Fatal("zero bytes accepted")
	}
}

func TestMedianGbps(t *testing.T) {
	runs := func(g ...float64) []Result {
		r := make([]Result, len(g))
		for k := range g {
			r[k].Gbps = g[k]
		}
		return r
	}
	for _, c := range []struct {
		runs []Result
		want float64
	}{
		{nil, 0},
		{runs(3), 3},
		{runs(9, 1, 5), 5},
		{runs(8, 2, 4, 100), 6},
	} {
		if got := medianGbps(c.runs); got != c.want {
			t.Fatalf("median of %v = %v, want %v", c.runs, got, c.want)
		}
	}
}

// TestInProcReportRatios: the ratios come from the medians of matching
// rows, and a missing or zero side gives 0, printed as "-".
func TestInProcReportRatios(t *testing.T) {
	row := func(link string, mtu int, g ...float64) InProcRow {
		r := InProcRow{Link: link, MTU: mtu}
		for _, x := range g {
			r.Runs = append(r.Runs, Result{Gbps: x})
		}
		return r
	}
	rep := &InProcReport{Rows: []InProcRow{
		row(LinkDirect, 65520, 10, 20, 30),
		row(LinkIBConnected, 65520, 16, 18, 1),
		row(LinkIBDatagram, 4092, 6, 5, 7),
	}}
	rep.summarise()
	if rep.ConnectedVsDirect != 16.0/20 || rep.ConnectedVsDatagram != 16.0/6 || rep.DatagramVsDirect != 0 {
		t.Fatalf("ratios %v %v %v", rep.ConnectedVsDirect, rep.ConnectedVsDatagram, rep.DatagramVsDirect)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "datagram/direct    -") || !strings.Contains(table.String(), "connected/direct   0.800x") {
		t.Fatalf("table:\n%s", table.String())
	}
}
