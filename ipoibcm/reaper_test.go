package ipoibcm

import (
	"fmt"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// reapSignal returns a channel that receives nd's EventReaped, one per
// passive connection reaped from now on.
func reapSignal(nd *testNode) chan Event {
	ch := make(chan Event, 1024)
	nd.events.on(EventReaped, func(e Event) { ch <- e })
	return ch
}

func waitN[T any](t *testing.T, ch chan T, n int, what string) []T {
	t.Helper()
	var got []T
	timeout := time.After(20 * time.Second)
	for len(got) < n {
		select {
		case v := <-ch:
			got = append(got, v)
		case <-timeout:
			t.Fatalf("%s: got %d of %d", what, len(got), n)
		}
	}
	return got
}

// staleConfig makes the passive LRU run in milliseconds (tests that only
// wait for reaps, never assert that a connection is still there).
func staleConfig(k int, c *Config) {
	c.StaleUpdate = 2 * time.Millisecond
	c.StaleAfter = 30 * time.Millisecond
	c.StaleScan = 10 * time.Millisecond
}

// manualStale keeps the periodic stale scan out of the test's way: a
// connection goes stale only when the test scans with a clock of its own
// (staleScanAt), so a slow machine cannot reap one the test still counts.
func manualStale(k int, c *Config) {
	c.StaleUpdate = 2 * time.Millisecond
	c.StaleAfter = time.Hour
	c.StaleScan = time.Hour
}

// onControl runs fn on nd's control loop and waits for it: fn sees the
// engine between two work items, as every control-loop event does.
func onControl(t *testing.T, nd *testNode, fn func()) {
	t.Helper()
	done := make(chan struct{})
	nd.ifc.ctl.post(func() {
		defer close(done)
		fn()
	})
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("control loop did not run the work item")
	}
}

// staleScanAt runs one stale scan on nd's control loop as if the clock
// read now.
func staleScanAt(t *testing.T, nd *testNode, now time.Time) {
	t.Helper()
	onControl(t, nd, func() { nd.ifc.staleScan(now) })
}

// eventBarrier is a QP of the test's own on a node's device. The soft
// fabric delivers every callback (async events, completion events) from
// one goroutine in the order raised; raising this QP's LAST_WQE after
// other QPs' events and waiting for its handler therefore waits until
// every handler before it has run.
type eventBarrier struct {
	qp     hca.QP
	passed chan struct{}
}

func newEventBarrier(t *testing.T, dev hca.Device) *eventBarrier {
	t.Helper()
	cq, err := dev.CreateCQ(hca.CQConfig{Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	srq, err := dev.CreateSRQ(hca.SRQConfig{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	b := &eventBarrier{passed: make(chan struct{})}
	b.qp, err = dev.CreateQP(hca.QPConfig{
		Type: hca.QPTypeRC, SendCQ: cq, RecvCQ: cq, SRQ: srq, MaxSendWR: 1,
		OnEvent: func(ev hca.AsyncEvent) {
			if ev.Type == hca.EventQPLastWQEReached {
				close(b.passed)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Registered after newTestNet's cleanup, so it runs before the fabric
	// closes.
	t.Cleanup(func() {
		b.qp.Destroy()
		srq.Destroy()
		cq.Destroy()
	})
	return b
}

// pass raises the barrier's event and waits until its handler ran; false
// if it did not within the timeout. It may run on the control loop: the
// fabric's dispatcher never waits for the engine.
func (b *eventBarrier) pass(timeout time.Duration) (bool, error) {
	if err := b.qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
		return false, fmt.Errorf("barrier QP to Error: %w", err)
	}
	select {
	case <-b.passed:
		return true, nil
	case <-time.After(timeout):
		return false, nil
	}
}

// A connection idle past StaleAfter is reaped by the scan through the
// whole protocol (Error, LAST_WQE, drain, destroy); one used within
// StaleAfter is not. The scans run with an explicit clock; the periodic
// scan is TestStaleScanTickerReaps'.
func TestStaleConnectionReaped(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 3}, manualStale)
	a, b := tn.nodes[0], tn.nodes[1]
	reaped := reapSignal(b)
	ping(t, a, b.v4, 100)
	if got := len(b.ifc.Stats().RXConns); got != 1 {
		t.Fatalf("b has %d passive connections, want 1", got)
	}
	// Just used: a scan now must leave it alone.
	staleScanAt(t, b, time.Now())
	st := b.ifc.Stats()
	if st.Reaper.StaleScans != 1 || st.Reaper.StaleReaped != 0 || len(st.RXConns) != 1 {
		t.Fatalf("fresh connection touched by the scan: %d passive connections, reaper %+v", len(st.RXConns), st.Reaper)
	}
	// A scan a StaleAfter (and more than one stamp refresh) later reaps it.
	staleScanAt(t, b, time.Now().Add(b.ifc.cfg.StaleAfter+time.Second))
	waitN(t, reaped, 1, "stale reap")
	st = b.ifc.Stats()
	r := st.Reaper
	if r.StaleScans != 2 || r.StaleReaped != 1 || r.MovedToError != 1 || r.LastWQESeen != 1 ||
		r.DrainsPosted != 1 || r.DrainsCompleted != 1 || r.Reaped != 1 {
		t.Fatalf("reaper stats %+v", r)
	}
	if len(st.RXConns) != 0 {
		t.Fatalf("passive connections left: %+v", st.RXConns)
	}
	if st.SRQPosted != DefaultRecvQueueSize {
		t.Fatalf("SRQ posted %d, want %d (buffers leaked)", st.SRQPosted, DefaultRecvQueueSize)
	}
	// a's TX connection got the DREQ; the next ping reconnects.
	ping(t, a, b.v4, 100)
	if fs := tn.fab.Stats(); fs.DestroyedQPOps != 0 || fs.CQOverflows != 0 {
		t.Fatalf("fabric: destroyed-QP ops %d, CQ overflows %d", fs.DestroyedQPOps, fs.CQOverflows)
	}
}

// The periodic scan (StaleScan) reaps an idle connection on its own. Only
// the reap is waited for: with real milliseconds nothing is asserted about
// a moment in between.
func TestStaleScanTickerReaps(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 3}, staleConfig)
	a, b := tn.nodes[0], tn.nodes[1]
	reaped := reapSignal(b)
	ping(t, a, b.v4, 100)
	waitN(t, reaped, 1, "stale reap by the periodic scan")
	r := b.ifc.Stats().Reaper
	if r.StaleScans == 0 || r.StaleReaped == 0 || r.RXAccepted == 0 || r.Reaped == 0 {
		t.Fatalf("reaper stats %+v", r)
	}
}

// Seven peers' connections to one node go stale in the same scan: they
// share drains (one drain covers every connection whose LAST_WQE arrived
// while another drain was outstanding), at most one drain WR is
// outstanding at a time, the RX CQ never overflows, the SRQ keeps every
// buffer.
func TestManyConnectionsReapedAtOnce(t *testing.T) {
	const n = 8
	tn := newTestNet(t, n, soft.Config{Seed: 4}, func(k int, c *Config) {
		c.RecvQueueSize = 64
		if k == 0 {
			manualStale(k, c)
		}
	})
	hub := tn.nodes[0]
	barrier := newEventBarrier(t, hub.dev)
	// At each reap (control loop, inside the drain completion's handling)
	// the drains in flight are posted - completed: more than one means a
	// second drain WR went out while the first was outstanding.
	var inFlightAtReap []uint64
	reaped := make(chan Event, n)
	hub.events.on(EventReaped, func(e Event) {
		inFlightAtReap = append(inFlightAtReap, hub.ifc.reaper.ctr.drainsPosted.Load()-hub.ifc.reaper.ctr.drainsCompleted.Load())
		reaped <- e
	})
	for k := 1; k < n; k++ {
		ping(t, tn.nodes[k], hub.v4, 1000)
	}
	if got := len(hub.ifc.Stats().RXConns); got != n-1 {
		t.Fatalf("hub has %d passive connections, want %d", got, n-1)
	}
	// One scan moves all seven to Error, each raising LAST_WQE. The
	// control loop stays in this work item until the fabric delivered all
	// seven events (the barrier's comes after them), so all seven
	// onLastWQE items are queued before the first drain can be posted.
	var passed bool
	var barrierErr error
	onControl(t, hub, func() {
		hub.ifc.staleScan(time.Now().Add(hub.ifc.cfg.StaleAfter + time.Second))
		passed, barrierErr = barrier.pass(10 * time.Second)
	})
	if barrierErr != nil || !passed {
		t.Fatalf("LAST_WQE events not delivered: passed %v, %v", passed, barrierErr)
	}
	waitN(t, reaped, n-1, "reaped")
	st := hub.ifc.Stats()
	r := st.Reaper
	if r.StaleScans != 1 || r.StaleReaped != n-1 || r.LastWQESeen != n-1 || r.Reaped != n-1 {
		t.Fatalf("not one scan reaping %d: %+v", n-1, r)
	}
	// The first LAST_WQE posts a drain for its connection alone; the other
	// six queue behind that outstanding drain and share the second. One
	// drain per connection (7) would mean no batching, or a drain posted
	// while another was outstanding.
	if r.DrainsPosted >= n-1 || r.DrainsPosted != 2 {
		t.Fatalf("drains posted %d for %d connections reaped in one scan, want 2", r.DrainsPosted, n-1)
	}
	if r.DrainsPosted != r.DrainsCompleted || r.DrainPostFailures != 0 {
		t.Fatalf("drains posted %d, completed %d, post failures %d", r.DrainsPosted, r.DrainsCompleted, r.DrainPostFailures)
	}
	onControl(t, hub, func() {}) // orders the hook's writes before the read
	for k, v := range inFlightAtReap {
		if v > 1 {
			t.Fatalf("reap %d: %d drains in flight, want at most 1 (all: %v)", k, v, inFlightAtReap)
		}
	}
	if r.CQErrors != 0 || tn.fab.Stats().CQOverflows != 0 {
		t.Fatalf("CQ overflow: %+v", r)
	}
	if st.SRQPosted != 64 {
		t.Fatalf("SRQ posted %d, want 64", st.SRQPosted)
	}
	t.Logf("reaper: %+v, drains in flight at each reap %v", r, inFlightAtReap)
}
