package soak

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// openIdle opens n connections from slots concurrent workers and leaves
// them idle; it returns them and how many the passive side accepted.
func openIdle(tb testing.TB, r *churnRig, n, slots int) []*peerConn {
	tb.Helper()
	conns := make([]*peerConn, n)
	errs := make(chan error, slots)
	var wg sync.WaitGroup
	for s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := s; k < n; k += slots {
				pc, err := r.peer.open(r.ifc.HWAddr(), s, 0, r.flows, false)
				if err == nil {
					err = pc.waitEstablished(10 * time.Second)
				}
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", k, err)
					return
				}
				conns[k] = pc
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return conns
}

// waitReaped waits until the passive side reaped want connections.
func waitReaped(tb testing.TB, r *churnRig, want uint64, timeout time.Duration) {
	tb.Helper()
	// The engine has no event for "reaped"; its counter is what to watch.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		got := r.ifc.Stats().Reaper.Reaped
		if got >= want {
			return
		}
		select {
		case <-deadline.C:
			tb.Fatalf("reaped %d of %d connections in %s", got, want, timeout)
		case <-tick.C:
		}
	}
}

// churnAccount is what the rig's counters say about its packets: sent by
// the peer, received intact by the passive side, and lost under a named
// reason (recycled as dead, dropped by the passive side, or a send the
// peer saw fail).
func churnAccount(r *churnRig) (sent, received, lost uint64) {
	sent, received = r.flows.totals()
	st := r.ifc.Stats()
	lost = st.Counters.RxDeadDropped + st.Counters.RxDropped + r.peer.sendErrors.Load()
	return sent, received, lost
}

// waitAccounted waits until every packet sent is received or lost, and
// returns the counts it last read. The peer's send completions are polled
// by its own goroutine, which has no event to wait on, so the counters are
// read again on each tick; the timeout only turns a hang into a failure,
// and the caller judges the counts.
func waitAccounted(tb testing.TB, r *churnRig, timeout time.Duration) (sent, received, lost uint64) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		sent, received, lost = churnAccount(r)
		if received+lost >= sent {
			return sent, received, lost
		}
		select {
		case <-deadline.C:
			return churnAccount(r)
		case <-tick.C:
		}
	}
}

// BenchmarkReap10k: 10,000 idle passive connections, torn down through the
// full protocol (dead flag, Error, LAST_WQE, drain, destroy) by the
// Interface's Close; the metric is the wall time of that teardown.
func BenchmarkReap10k(b *testing.B) {
	const n = 10000
	for range b.N {
		b.StopTimer()
		r, err := newChurnRig(churnRigConfig{slots: 64, recvQueueSize: 64})
		if err != nil {
			b.Fatal(err)
		}
		openIdle(b, r, n, 64)
		if got := len(r.ifc.Stats().RXConns); got != n {
			b.Fatalf("%d passive connections, want %d", got, n)
		}
		b.StartTimer()
		start := time.Now()
		r.ifc.Close()
		elapsed := time.Since(start)
		b.StopTimer()
		st := r.ifc.Stats().Reaper
		if st.Reaped != n || st.ForcedAtStop != 0 {
			b.Fatalf("reaped %d, forced %d, want %d, 0", st.Reaped, st.ForcedAtStop, n)
		}
		b.ReportMetric(float64(elapsed.Milliseconds()), "ms/10k-reap")
		r.close()
	}
}

// BenchmarkPassiveConnMemory: heap per idle passive connection beyond the
// QPs, as an upper bound: the heap growth of n open connections (both
// sides: the peer's QP and CM id, the Interface's QP, CM id and
// connection state) less twice the growth of n bare soft QPs.
func BenchmarkPassiveConnMemory(b *testing.B) {
	const n = 5000
	for range b.N {
		qpBytes := bareQPBytes(b, n)
		r, err := newChurnRig(churnRigConfig{slots: 64, recvQueueSize: 64})
		if err != nil {
			b.Fatal(err)
		}
		before := liveHeap()
		conns := openIdle(b, r, n, 64)
		after := liveHeap()
		runtime.KeepAlive(conns)
		total := float64(after-before) / n
		beyond := total - 2*qpBytes
		b.ReportMetric(total, "B/conn-both-sides")
		b.ReportMetric(qpBytes, "B/bare-qp")
		b.ReportMetric(beyond, "B/conn-beyond-qps")
		r.close()
	}
}

// bareQPBytes is the heap growth per soft RC QP configured like a passive
// IPoIB QP (SRQ-attached, two send WRs).
func bareQPBytes(tb testing.TB, n int) float64 {
	tb.Helper()
	r, err := newChurnRig(churnRigConfig{slots: 1, recvQueueSize: 16})
	if err != nil {
		tb.Fatal(err)
	}
	defer r.close()
	dev, err := r.fab.NewDevice("bare")
	if err != nil {
		tb.Fatal(err)
	}
	cq, err := dev.CreateCQ(hca.CQConfig{Size: 16})
	if err != nil {
		tb.Fatal(err)
	}
	srq, err := dev.CreateSRQ(hca.SRQConfig{MaxWR: 16})
	if err != nil {
		tb.Fatal(err)
	}
	qps := make([]hca.QP, n)
	before := liveHeap()
	for k := range qps {
		qps[k], err = dev.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: cq, RecvCQ: cq, SRQ: srq, MaxSendWR: 2, Context: &k})
		if err != nil {
			tb.Fatal(err)
		}
	}
	after := liveHeap()
	runtime.KeepAlive(qps)
	return float64(after-before) / float64(n)
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkChurn: connect, send one packet, disconnect; the passive side
// delivers the packet and reaps the connection. The metric counts full
// cycles per second of wall time, the reaping included.
func BenchmarkChurn(b *testing.B) {
	const slots = 32
	r, err := newChurnRig(churnRigConfig{slots: slots, recvQueueSize: 256})
	if err != nil {
		b.Fatal(err)
	}
	defer r.close()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, slots)
	for s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := uint64(0)
			for k := s; k < b.N; k += slots {
				seq++
				pc, err := r.peer.open(r.ifc.HWAddr(), s, seq, r.flows, true)
				if err == nil {
					err = pc.waitEstablished(10 * time.Second)
				}
				if err != nil {
					errs <- err
					return
				}
				pc.close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	waitReaped(b, r, uint64(b.N), 30*time.Second)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	// A packet still in the passive CQ when the DREQ arrives is recycled
	// as dead, as Linux does; every packet is delivered or counted so.
	sent, received, lost := waitAccounted(b, r, 10*time.Second)
	if sent != uint64(b.N) || received+lost != sent || r.viol.total() != 0 {
		b.Fatalf("%d cycles: sent %d, received %d, dead, dropped or failed %d, %d violations", b.N, sent, received, lost, r.viol.total())
	}
	b.ReportMetric(float64(received)/float64(sent), "delivered/sent")
}

// TestChurnRig checks the rig itself at a small scale: every cycle's
// packet arrives intact and every connection is reaped.
func TestChurnRig(t *testing.T) {
	r, err := newChurnRig(churnRigConfig{slots: 4, recvQueueSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for k := range 20 {
		pc, err := r.peer.open(r.ifc.HWAddr(), k%4, uint64(k/4+1), r.flows, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.waitEstablished(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		pc.close()
	}
	waitReaped(t, r, 20, 10*time.Second)
	sent, received := r.flows.totals()
	st := r.ifc.Stats()
	// A packet still in the passive CQ when its DREQ arrives is recycled
	// as dead, as Linux does: each packet is delivered intact or counted.
	dead := st.Counters.RxDeadDropped
	if sent != 20 || received+dead != 20 || received == 0 || r.viol.total() != 0 {
		t.Fatalf("sent %d received %d dead %d violations %+v", sent, received, dead, r.viol.results())
	}
	if st.Reaper.RXAccepted != 20 || st.Reaper.DrainsCompleted == 0 || len(st.RXConns) != 0 {
		t.Fatalf("reaper %+v, %d passive connections left", st.Reaper, len(st.RXConns))
	}
}
