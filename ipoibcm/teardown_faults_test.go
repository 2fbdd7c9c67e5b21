package ipoibcm

import (
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// killPassive tears down every live passive connection of nd through the
// normal protocol, as the stale scan or a DREQ would. The returned channel
// receives, once the control loop ran the teardown, how many connections
// were live and moved to teardown.
func killPassive(nd *testNode) <-chan int {
	moved := make(chan int, 1)
	nd.ifc.ctl.post(func() {
		nd.ifc.passive.mu.Lock()
		var rcs []*rxConn
		for rc := range nd.ifc.passive.set {
			// Only the control loop moves a connection out of rxLive, and
			// this runs on it: the count is exact.
			if rc.state == rxLive {
				rcs = append(rcs, rc)
			}
		}
		nd.ifc.passive.mu.Unlock()
		for _, rc := range rcs {
			nd.ifc.passive.rxTransition(rc, rxEvShutdown)
		}
		moved <- len(rcs)
	})
	return moved
}

// Passive connections are torn down again and again under a TCP transfer
// while the fabric delays completions past destroy, reuses QPNs at once
// and delays LAST_WQE: no completion reaches a destroyed connection, no
// operation touches a destroyed QP, no byte is corrupted, no SRQ buffer is
// lost, and the receiver keeps accepting new connections (the sender
// reconnects after each DREQ).
func TestTeardownUnderFaults(t *testing.T) {
	faults := soft.Faults{
		CompletionDelay:   soft.CompletionDelay{Probability: 0.05, Max: 2 * time.Millisecond},
		ImmediateQPNReuse: true,
		LastWQEDelay:      time.Millisecond,
	}
	tn := newTestNet(t, 2, soft.Config{Seed: 10, Faults: faults}, func(k int, c *Config) {
		c.RecvQueueSize = 128
	})
	a, b := tn.nodes[0], tn.nodes[1]
	reaped := reapSignal(b)
	stop := make(chan struct{})
	var firstKill <-chan int
	var wg sync.WaitGroup
	// Stop the killer even when the transfer fails the test: it must not
	// outlive the interfaces (the goroutine check in cleanup would flag it).
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	tcpTransfer(t, a, b, b.v4, 16<<20, func() {
		// The first kill is posted right here, a quarter into the transfer,
		// while its passive connection is certainly live (it carried that
		// quarter, and only a kill ends it). Waiting a tick first let a
		// fast machine finish the transfer untouched. The ticker then keeps
		// killing the reconnections.
		firstKill = killPassive(b)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-tick.C:
					killPassive(b)
				case <-stop:
					return
				}
			}
		}()
	})
	close(stop)
	wg.Wait()
	if firstKill == nil {
		t.Fatal("the transfer never reached a quarter")
	}
	select {
	case n := <-firstKill:
		if n == 0 {
			t.Fatal("first kill, a quarter into the transfer, found no live passive connection")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the control loop never ran the first kill")
	}
	// The transfer can end while the last teardown still waits for its
	// LAST_WQE and drain: wait for the reap itself, not a moment.
	waitN(t, reaped, 1, "reap of a killed connection")
	st := b.ifc.Stats()
	if st.Reaper.Reaped == 0 {
		t.Fatal("no passive connection was reaped")
	}
	fs := tn.fab.Stats()
	if fs.CompletionsAfterDestroy != 0 || fs.DestroyedQPOps != 0 || fs.CQOverflows != 0 {
		t.Fatalf("fabric: completions after destroy %d, destroyed-QP ops %d, CQ overflows %d",
			fs.CompletionsAfterDestroy, fs.DestroyedQPOps, fs.CQOverflows)
	}
	if st.Reaper.DrainsPosted != st.Reaper.DrainsCompleted && len(st.RXConns) == 0 {
		t.Fatalf("drains posted %d completed %d", st.Reaper.DrainsPosted, st.Reaper.DrainsCompleted)
	}
	t.Logf("reaper %+v, rx_dead_dropped %d, delayed completions %d", st.Reaper, st.Counters.RxDeadDropped, fs.DelayedCompletions)
}

// LAST_WQE for a connection that is still live (the QP errored without
// the engine asking, e.g. before the REQ handler finished): the engine
// marks it dead first and reaps it through the drain.
func TestLastWQEWhileLive(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 11}, nil)
	a, b := tn.nodes[0], tn.nodes[1]
	reaped := reapSignal(b)
	ping(t, a, b.v4, 64)
	b.ifc.passive.mu.Lock()
	var rc *rxConn
	for c := range b.ifc.passive.set {
		rc = c
	}
	b.ifc.passive.mu.Unlock()
	if err := rc.qp.Modify(hcaErrorAttr()); err != nil {
		t.Fatal(err)
	}
	got := waitN(t, reaped, 1, "reap after LAST_WQE")
	if got[0].QPN != rc.qp.QPN() || !rc.dead.Load() {
		t.Fatalf("reaped QP %#x (dead %v), want %#x dead", got[0].QPN, rc.dead.Load(), rc.qp.QPN())
	}
	if st := b.ifc.Stats(); st.Reaper.LateLastWQE != 1 || st.Reaper.DrainsCompleted != 1 {
		t.Fatalf("reaper %+v", st.Reaper)
	}
	// a's connection still points at the dead QP: its next send fails,
	// the engine tears it down and reconnects.
	ping(t, a, b.v4, 64)
}
