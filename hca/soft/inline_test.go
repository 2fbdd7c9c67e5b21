package soft

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// goid is the calling goroutine's runtime id, read from its stack header,
// so a test can tell which goroutine ran a handler.
func goid(t *testing.T) uint64 {
	var buf [64]byte
	s := string(buf[:runtime.Stack(buf[:], false)])
	s, _ = strings.CutPrefix(s, "goroutine ")
	id, err := strconv.ParseUint(s[:strings.IndexByte(s, ' ')], 10, 64)
	if err != nil {
		t.Errorf("goroutine id from %q: %v", s, err)
	}
	return id
}

// inlinePair is an RC connection a -> b whose CQs deliver their completion
// events inline; the handlers record the goroutine they ran on.
type inlinePair struct {
	f          *Fabric
	a, b       *qp
	acq, bcq   *cq
	mu         sync.Mutex
	aGoid      []uint64
	bGoid      []uint64
	lastWQE    chan uint64 // goroutine that delivered LAST_WQE_REACHED
	srq        *srq
	onAHandler func()
}

func newInlinePair(t *testing.T, inline bool) *inlinePair {
	t.Helper()
	p := &inlinePair{f: NewFabric(Config{Seed: 1}), lastWQE: make(chan uint64, 1)}
	t.Cleanup(func() { p.f.Close() })
	da, err := p.f.NewDevice("a")
	must(t, err)
	db, err := p.f.NewDevice("b")
	must(t, err)
	acq, err := da.CreateCQ(hca.CQConfig{Size: 256, InlineCompletion: inline, OnCompletion: func() {
		id := goid(t)
		p.mu.Lock()
		p.aGoid = append(p.aGoid, id)
		fn := p.onAHandler
		p.mu.Unlock()
		if fn != nil {
			fn()
		}
	}})
	must(t, err)
	bcq, err := db.CreateCQ(hca.CQConfig{Size: 256, InlineCompletion: inline, OnCompletion: func() {
		id := goid(t)
		p.mu.Lock()
		p.bGoid = append(p.bGoid, id)
		p.mu.Unlock()
	}})
	must(t, err)
	s, err := db.CreateSRQ(hca.SRQConfig{MaxWR: 64})
	must(t, err)
	a, err := da.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: acq, RecvCQ: acq, MaxSendWR: 64})
	must(t, err)
	b, err := db.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: bcq, RecvCQ: bcq, SRQ: s, MaxSendWR: 64,
		OnEvent: func(ev hca.AsyncEvent) {
			if ev.Type == hca.EventQPLastWQEReached {
				p.lastWQE <- goid(t)
			}
		}})
	must(t, err)
	p.a, p.b, p.acq, p.bcq, p.srq = a.(*qp), b.(*qp), acq.(*cq), bcq.(*cq), s.(*srq)
	for _, q := range [][2]*qp{{p.a, p.b}, {p.b, p.a}} {
		must(t, q[0].Modify(hca.QPAttr{State: hca.QPStateInit}))
		must(t, q[0].Modify(hca.QPAttr{State: hca.QPStateRTR, DestQPN: q[1].qpn, DestGID: q[1].dev.gid}))
		// RNR retry 7: a send to a peer without buffers waits (and can
		// be flushed) instead of failing.
		must(t, q[0].Modify(hca.QPAttr{State: hca.QPStateRTS, RNRRetry: 7}))
	}
	for i := range 16 {
		_, err := p.srq.PostRecv([]hca.RecvWR{{ID: uint64(i), Buf: make([]byte, 64)}})
		must(t, err)
	}
	return p
}

func (p *inlinePair) handlerGoroutines() (a, b []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uint64(nil), p.aGoid...), append([]uint64(nil), p.bGoid...)
}

// TestInlineCompletionRunsInPostSend: with InlineCompletion both the
// sender's send-CQ event and the responder's receive-CQ event have run,
// on the posting goroutine, by the time PostSend returns.
func TestInlineCompletionRunsInPostSend(t *testing.T) {
	p := newInlinePair(t, true)
	p.acq.Notify(false)
	p.bcq.Notify(false)
	if _, err := p.a.PostSend([]hca.SendWR{{ID: 1, Data: []byte("hello")}}); err != nil {
		t.Fatal(err)
	}
	me := goid(t)
	a, b := p.handlerGoroutines()
	if len(a) != 1 || a[0] != me || len(b) != 1 || b[0] != me {
		t.Fatalf("handlers ran on %v (send CQ) and %v (recv CQ), want [%d] each, before PostSend returned", a, b, me)
	}
	st := p.f.Stats()
	if st.InlineEvents != 2 || st.DispatchedEvents != 0 {
		t.Fatalf("InlineEvents %d DispatchedEvents %d, want 2 and 0", st.InlineEvents, st.DispatchedEvents)
	}
	// Unarmed CQs fire nothing, inline or not.
	if _, err := p.a.PostSend([]hca.SendWR{{ID: 2, Data: []byte("again")}}); err != nil {
		t.Fatal(err)
	}
	if a, b := p.handlerGoroutines(); len(a) != 1 || len(b) != 1 {
		t.Fatalf("unarmed CQs fired: %v %v", a, b)
	}
}

// TestCompletionDispatchedByDefault: without InlineCompletion the contract
// still holds that posting never calls back synchronously.
func TestCompletionDispatchedByDefault(t *testing.T) {
	p := newInlinePair(t, false)
	done := make(chan struct{})
	p.mu.Lock()
	p.onAHandler = func() { close(done) }
	p.mu.Unlock()
	p.acq.Notify(false)
	if _, err := p.a.PostSend([]hca.SendWR{{ID: 1, Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	<-done
	me := goid(t)
	a, _ := p.handlerGoroutines()
	if len(a) != 1 || a[0] == me {
		t.Fatalf("send CQ handler ran on %v; want one run on the dispatcher, not on %d", a, me)
	}
	if st := p.f.Stats(); st.InlineEvents != 0 || st.DispatchedEvents != 1 {
		t.Fatalf("InlineEvents %d DispatchedEvents %d, want 0 and 1", st.InlineEvents, st.DispatchedEvents)
	}
}

// TestInlineHandlerWhilePosterHoldsItsLock is the shape the engine relies
// on: the poster holds its own lock across PostSend, and the inline
// handler, which does not need that lock, re-enters the verbs (Poll,
// Notify, PostSend on the same QP) without deadlock, because the fabric
// lock is released before it runs.
func TestInlineHandlerWhilePosterHoldsItsLock(t *testing.T) {
	p := newInlinePair(t, true)
	var posterMu sync.Mutex
	var polled []hca.WC
	reposted := false
	p.mu.Lock()
	p.onAHandler = func() {
		// Called synchronously while the poster holds posterMu; taking
		// it here would deadlock, so a conforming handler never does.
		if posterMu.TryLock() {
			posterMu.Unlock()
			t.Errorf("poster's lock was free inside the inline handler")
		}
		// napi's loop: poll, re-arm with missed-event reporting, repeat.
		buf := make([]hca.WC, 8)
		for {
			n := p.acq.Poll(buf)
			polled = append(polled, buf[:n]...)
			if !reposted {
				reposted = true
				if _, err := p.a.PostSend([]hca.SendWR{{ID: 2, Data: []byte("from handler")}}); err != nil {
					t.Errorf("post from inline handler: %v", err)
				}
				continue
			}
			if n == 0 && !p.acq.Notify(true) {
				return
			}
		}
	}
	p.mu.Unlock()
	p.acq.Notify(false)
	posterMu.Lock()
	_, err := p.a.PostSend([]hca.SendWR{{ID: 1, Data: []byte("first")}})
	posterMu.Unlock()
	must(t, err)
	// The handler's own post completed while it held no fabric lock, and
	// its loop polled that completion too.
	ids := []uint64{}
	for _, wc := range polled {
		ids = append(ids, wc.ID)
	}
	if len(ids) != 2 || ids[0] != 1 || ids[1] != 2 {
		t.Fatalf("inline handler polled %v, want send completions [1 2]", ids)
	}
	if a, _ := p.handlerGoroutines(); len(a) != 1 || a[0] != goid(t) {
		t.Fatalf("send CQ handler ran on %v, want once, inline", a)
	}
}

// TestAsyncEventsNeverInline: flushing on Modify(Error) raises completion
// events inline but LAST_WQE_REACHED from the dispatcher.
func TestAsyncEventsNeverInline(t *testing.T) {
	p := newInlinePair(t, true)
	// a has no receive buffer: b's send waits (RNR retry 7) until the
	// Modify below flushes it.
	_, err := p.b.PostSend([]hca.SendWR{{ID: 9, Data: []byte("b->a")}})
	must(t, err)
	p.bcq.Notify(false)
	must(t, p.b.Modify(hca.QPAttr{State: hca.QPStateError}))
	me := goid(t)
	if _, b := p.handlerGoroutines(); len(b) != 1 || b[0] != me {
		t.Fatalf("flush completion event ran on %v, want [%d] (inline in Modify)", b, me)
	}
	if g := <-p.lastWQE; g == me {
		t.Fatalf("LAST_WQE_REACHED delivered inline on %d", g)
	}
}

// TestInlineOverflowGoesToDispatcher: more armed CQs firing under one
// hold of the fabric lock than maxInlineFires spill to the dispatcher and
// none is lost.
func TestInlineOverflowGoesToDispatcher(t *testing.T) {
	f := NewFabric(Config{Seed: 1})
	defer f.Close()
	const members = maxInlineFires + 3
	mgid := hca.GID{0xff, 0x12, 0x40, 0x1b, 15: 1}
	var wg sync.WaitGroup
	wg.Add(members)
	var recv []*qp
	for k := range members {
		d, err := f.NewDevice("m" + strconv.Itoa(k))
		must(t, err)
		c, err := d.CreateCQ(hca.CQConfig{Size: 4, InlineCompletion: true, OnCompletion: wg.Done})
		must(t, err)
		q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c, RecvCQ: c})
		must(t, err)
		u := q.(*qp)
		must(t, u.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 7}))
		must(t, u.Modify(hca.QPAttr{State: hca.QPStateRTR}))
		must(t, u.Modify(hca.QPAttr{State: hca.QPStateRTS}))
		must(t, u.AttachMcast(mgid))
		_, err = u.PostRecv([]hca.RecvWR{{ID: 1, Buf: make([]byte, 64)}})
		must(t, err)
		c.Notify(false)
		recv = append(recv, u)
	}
	sd, err := f.NewDevice("sender")
	must(t, err)
	sc, err := sd.CreateCQ(hca.CQConfig{Size: 4})
	must(t, err)
	sq, err := sd.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: sc, RecvCQ: sc})
	must(t, err)
	must(t, sq.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 7}))
	must(t, sq.Modify(hca.QPAttr{State: hca.QPStateRTR}))
	must(t, sq.Modify(hca.QPAttr{State: hca.QPStateRTS}))
	ah, err := sd.CreateAH(mgid)
	must(t, err)
	_, err = sq.PostSend([]hca.SendWR{{ID: 1, Data: []byte("all"), AH: ah, RemoteQPN: hca.QPNMulticast, RemoteQKey: 7}})
	must(t, err)
	wg.Wait() // every member's event arrives, inline or dispatched
	st := f.Stats()
	if st.InlineEvents != maxInlineFires || st.DispatchedEvents != members-maxInlineFires {
		t.Fatalf("InlineEvents %d DispatchedEvents %d, want %d and %d", st.InlineEvents, st.DispatchedEvents, maxInlineFires, members-maxInlineFires)
	}
}
