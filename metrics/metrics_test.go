package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// pair is two gVisor hosts over ib0 on one soft fabric, exported by m.
type pair struct {
	hosts [2]*netstack.Host
	ifcs  [2]*ipoibcm.Interface
	addrs [2]netip.Addr
}

// reapWatch tells of the first passive connection reaped.
type reapWatch struct{ reaped chan struct{} }

func (w reapWatch) ObserveEvent(e ipoibcm.Event) {
	if e.Kind == ipoibcm.EventReaped {
		select {
		case w.reaped <- struct{}{}:
		default:
		}
	}
}

// extraFor gives the extra observer to the second host only: the test
// waits for h2's reap, and h1 has passive connections of its own.
func extraFor(i int, extra ipoibcm.EventObserver) ipoibcm.EventObserver {
	if i == 1 {
		return extra
	}
	return nil
}

func newPair(t *testing.T, m *Metrics, staleAfter time.Duration, extra ipoibcm.EventObserver) *pair {
	t.Helper()
	fab := soft.NewFabric(soft.Config{Seed: 1})
	t.Cleanup(func() { fab.Close() })
	p := &pair{}
	for i := range 2 {
		name := fmt.Sprintf("h%d", i+1)
		p.addrs[i] = netip.AddrFrom4([4]byte{10, 78, 0, byte(i + 1)})
		h, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(p.addrs[i], 24)}, MTU: 65520})
		if err != nil {
			t.Fatal(err)
		}
		p.hosts[i] = h
		dev, err := fab.NewDevice(name)
		if err != nil {
			t.Fatal(err)
		}
		ifc, err := ipoibcm.New(ipoibcm.Config{Device: dev, Host: h, Name: "ib0", Mode: ipoibcm.ModeConnected,
			StaleAfter: staleAfter, StaleScan: staleAfter / 4, StaleUpdate: staleAfter / 4, Events: ipoibcm.Observers(m.Observer(name), extraFor(i, extra))})
		if err != nil {
			t.Fatal(err)
		}
		if err := ifc.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ifc.Close(); dev.Close() })
		p.ifcs[i] = ifc
		m.Add(Source{Host: name, Stats: ifc.Stats})
	}
	return p
}

func (p *pair) ping(t *testing.T, from int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.hosts[from].Ping(ctx, p.addrs[1-from], 1000); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

// histogramCount is the sample count of a histogram series.
func histogramCount(t *testing.T, m *Metrics, name, host string) uint64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if labelOf(s, "host") == host {
				return s.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestHistogramsTimeConnectAndTeardown(t *testing.T) {
	m := New()
	watch := reapWatch{reaped: make(chan struct{}, 1)}
	p := newPair(t, m, 40*time.Millisecond, watch)
	p.ping(t, 0)
	// h1's REQ to h2 was timed once established.
	if n := histogramCount(t, m, "ipoib_cm_connect_seconds", "h1"); n < 1 {
		t.Fatalf("h1 connect histogram has %d samples", n)
	}
	// h2's passive connection goes stale and is reaped: dead flag to
	// destroy lands in the teardown histogram.
	select {
	case <-watch.reaped:
	case <-time.After(10 * time.Second):
		t.Fatalf("no passive connection reaped: %+v", p.ifcs[1].Stats().Reaper)
	}
	if n := histogramCount(t, m, "ipoib_passive_teardown_seconds", "h2"); n < 1 {
		t.Fatalf("h2 teardown histogram has %d samples after %d reaped", n, p.ifcs[1].Stats().Reaper.Reaped)
	}
}

func TestScrapeOverHTTP(t *testing.T) {
	m := New()
	p := newPair(t, m, time.Minute, nil)
	p.ping(t, 0)
	srv, err := Serve("127.0.0.1:0", m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Get("http://" + srv.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`ipoib_rx_packets_total{host="h2"}`,
		`ipoib_drops_total{host="h1",reason="tx_vlan"} 0`,
		`ipoib_napi_polls_total{host="h1",poller="rx"}`,
		`ipoib_reaper_tx_established_total{host="h1"} 1`,
		`ipoib_cm_sent_total{host="h1",type="REQ"} 1`,
		`ipoib_connections{dir="tx",host="h1",state="up"} 1`,
		`ipoib_conn_packets_total{dir="tx",host="h1"`,
		`ipoib_cm_connect_seconds_bucket{host="h1",le="+Inf"} 1`,
		`ipoib_queue_tx_packets_total{host="h1",queue="0"}`,
		`ipoib_queue_rx_bytes_total{host="h2",queue="0"}`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", text)
	}
}

func TestConnSeriesBounded(t *testing.T) {
	var cs []ipoibcm.ConnInfo
	for k := range 1000 {
		cs = append(cs, ipoibcm.ConnInfo{LocalQPN: hca.QPN(0x100 + k), RemoteQPN: 7, State: "live", Packets: 1, Bytes: uint64(k)})
	}
	cs = append(cs, ipoibcm.ConnInfo{LocalQPN: 0, State: "connecting", Packets: 1}) // no QP yet
	s := ipoibcm.Stats{RXConns: cs, Drops: map[string]uint64{}}
	m := New()
	m.Add(Source{Host: "h", Stats: func() ipoibcm.Stats { return s }})
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() == "ipoib_conn_packets_total" {
			series = mf.GetMetric()
		}
	}
	if len(series) != MaxConnSeries+1 {
		t.Fatalf("%d per-connection series for 1001 connections, want %d", len(series), MaxConnSeries+1)
	}
	for _, sm := range series {
		if labelOf(sm, "local_qpn") == "other" {
			// 1001 connections of one packet each, MaxConnSeries shown.
			if got := sm.GetCounter().GetValue(); got != float64(1001-MaxConnSeries) {
				t.Fatalf("other = %v, want %d", got, 1001-MaxConnSeries)
			}
			return
		}
	}
	t.Fatal("no local_qpn=\"other\" series")
}
