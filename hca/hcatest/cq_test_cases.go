package hcatest

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// flushSource is a UD QP in Init with posted receives: moving it to Error
// produces one flush completion per receive, with no network involved.
func flushSource(t *testing.T, f Fabric, dev hca.Device, cq *cqWaiter, n int) *endpoint {
	t.Helper()
	e := newEndpoint(t, f, dev, hca.QPTypeUD, qpOpts{recvCQ: cq, sendCQ: cq})
	modify(t, e.qp, hca.QPAttr{State: hca.QPStateInit, QKey: testQKey})
	buf := alloc(t, dev, 64)
	for i := range n {
		postRecv(t, e.qp, hca.RecvWR{ID: uint64(i), Buf: buf})
	}
	return e
}

func testNotify(t *testing.T, f Fabric) {
	dev := f.NewDevice(t)
	cq := newCQ(t, f, dev, 64)
	if cq.Notify(true) {
		t.Fatalf("Notify(true) on an empty CQ reported missed events")
	}
	// A completion after arming fires the handler once.
	first := flushSource(t, f, dev, cq, 3)
	modify(t, first.qp, hca.QPAttr{State: hca.QPStateError})
	waitSignal(t, f, cq.wake, "completion event")
	// The completions are queued and unpolled: arming must report them.
	for !cq.Notify(true) {
		// Delayed backends: the completion event is still in flight.
		waitSignal(t, f, cq.wake, "completion event")
	}
	wcs := cq.wait(t, 3)
	for i, wc := range wcs {
		expectWC(t, wc, uint64(i), hca.StatusWRFlushErr, hca.WCRecv)
	}
	if fires, arms := cq.fires.Load(), cq.arms.Load(); fires < 1 || fires > arms {
		t.Fatalf("%d completion events for %d arms", fires, arms)
	}
	// Completions arriving while armed fire the handler exactly once for
	// the arm, however many arrive.
	armsBefore, firesBefore := cq.arms.Load(), cq.fires.Load()
	select {
	case <-cq.wake: // a stale signal from an earlier arm
	default:
	}
	if cq.Notify(true) {
		t.Fatalf("Notify(true) reported missed events with nothing queued")
	}
	second := flushSource(t, f, dev, cq, 5)
	modify(t, second.qp, hca.QPAttr{State: hca.QPStateError})
	waitSignal(t, f, cq.wake, "completion event")
	if d := cq.fires.Load() - firesBefore; d < 1 || d > cq.arms.Load()-armsBefore {
		t.Fatalf("%d events for %d arms", d, cq.arms.Load()-armsBefore)
	}
	cq.wait(t, 5)
	if fires, arms := cq.fires.Load(), cq.arms.Load(); fires > arms {
		t.Fatalf("%d completion events for %d arms", fires, arms)
	}
}

// waitSignal waits for one signal on ch, failing after the guard timeout.
func waitSignal(t *testing.T, f Fabric, ch <-chan struct{}, what string) {
	t.Helper()
	g := time.NewTimer(timeout(f))
	defer g.Stop()
	select {
	case <-ch:
	case <-g.C:
		t.Fatalf("timed out after %v waiting for %s", timeout(f), what)
	}
}

func testCQOverflow(t *testing.T, f Fabric) {
	dev := f.NewDevice(t)
	cq := newCQ(t, f, dev, 4)
	src := flushSource(t, f, dev, cq, 6)
	modify(t, src.qp, hca.QPAttr{State: hca.QPStateError})
	cq.events.waitFor(t, timeout(f), hca.EventCQErr, 0)
	if got := len(cq.pollNow()); got > 4 {
		t.Fatalf("polled %d completions from a 4-entry CQ", got)
	}
}

func testFlushOnError(t *testing.T, f Fabric) {
	da, db := f.NewDevice(t), f.NewDevice(t)
	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: 4})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{ctx: "a"})
	b := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq})
	// RNR retry 7 against an empty SRQ keeps a's sends posted.
	connect(t, a, b, qpOpts{rnrRetry: 7}, qpOpts{minRNR: 1})
	buf := alloc(t, da, 3*64)
	postRecv(t, a.qp, hca.RecvWR{ID: 20, Buf: buf[:64]}, hca.RecvWR{ID: 21, Buf: buf[64:128]})
	postSend(t, a.qp, hca.SendWR{ID: 10, Data: buf[:8]}, hca.SendWR{ID: 11, Data: buf[:8]}, hca.SendWR{ID: 12, Data: buf[:8]})
	modify(t, a.qp, hca.QPAttr{State: hca.QPStateError})
	sw := a.sendCQ.wait(t, 3)
	rw := a.recvCQ.wait(t, 2)
	for i, wc := range sw {
		expectWC(t, wc, uint64(10+i), hca.StatusWRFlushErr, hca.WCSend)
		if wc.Context != "a" || wc.QPN != a.qp.QPN() {
			t.Fatalf("flush completion %+v lacks the QP's context", wc)
		}
	}
	for i, wc := range rw {
		expectWC(t, wc, uint64(20+i), hca.StatusWRFlushErr, hca.WCRecv)
	}
	// Receives posted in Error flush too.
	postRecv(t, a.qp, hca.RecvWR{ID: 22, Buf: buf[128:]})
	expectWC(t, a.recvCQ.wait(t, 1)[0], 22, hca.StatusWRFlushErr, hca.WCRecv)
	if srq.Posted() != 0 {
		t.Fatalf("SRQ gained buffers")
	}
}

func testLastWQE(t *testing.T, f Fabric) {
	dev := f.NewDevice(t)
	srq, err := dev.CreateSRQ(hca.SRQConfig{MaxWR: 8})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	plain := newEndpoint(t, f, dev, hca.QPTypeRC, qpOpts{})
	shared := newEndpoint(t, f, dev, hca.QPTypeRC, qpOpts{srq: srq, ctx: "conn", sameCQ: true})
	for _, e := range []*endpoint{plain, shared} {
		modify(t, e.qp, hca.QPAttr{State: hca.QPStateInit})
	}
	modify(t, plain.qp, hca.QPAttr{State: hca.QPStateError})
	modify(t, shared.qp, hca.QPAttr{State: hca.QPStateError})
	ev := shared.events.waitFor(t, timeout(f), hca.EventQPLastWQEReached, shared.qp.QPN())
	if ev.Context != "conn" {
		t.Fatalf("LAST_WQE_REACHED context %v", ev.Context)
	}
	modify(t, shared.qp, hca.QPAttr{State: hca.QPStateError}) // Error -> Error is legal
	// A drain WR on the errored QP gives a duplicate event time to show up
	// (best effort: the suite cannot prove "never").
	postSend(t, shared.qp, hca.SendWR{ID: 0xffffffff})
	expectWC(t, shared.sendCQ.wait(t, 1)[0], 0xffffffff, hca.StatusWRFlushErr, hca.WCSend)
	if n := shared.events.count(hca.EventQPLastWQEReached, shared.qp.QPN()); n != 1 {
		t.Fatalf("%d LAST_WQE_REACHED events for one SRQ QP, want 1", n)
	}
	if n := plain.events.count(hca.EventQPLastWQEReached, plain.qp.QPN()); n != 0 {
		t.Fatalf("%d LAST_WQE_REACHED events for a QP without SRQ", n)
	}
}

func testDrain(t *testing.T, f Fabric) {
	const n = 10
	da, db := f.NewDevice(t), f.NewDevice(t)
	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: n})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{})
	// IPoIB's receive QPs send and receive on the one RX CQ.
	rx := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq, sameCQ: true, ctx: "rx"})
	connect(t, a, rx, qpOpts{}, qpOpts{})
	buf := alloc(t, db, n*32)
	for i := range n {
		postRecv(t, srq, hca.RecvWR{ID: uint64(i), Buf: buf[i*32 : i*32+32]})
	}
	msg := alloc(t, da, 16)
	for i := range n {
		postSend(t, a.qp, hca.SendWR{ID: uint64(i), Data: msg})
	}
	a.sendCQ.wait(t, n) // all delivered; receive completions queued, unpolled
	modify(t, rx.qp, hca.QPAttr{State: hca.QPStateError})
	rx.events.waitFor(t, timeout(f), hca.EventQPLastWQEReached, rx.qp.QPN())
	const drainID = 0xffffffff
	postSend(t, rx.qp, hca.SendWR{ID: drainID})
	wcs := rx.recvCQ.wait(t, n+1)
	for i := range n {
		expectWC(t, wcs[i], uint64(i), hca.StatusSuccess, hca.WCRecv)
	}
	expectWC(t, wcs[n], drainID, hca.StatusWRFlushErr, hca.WCSend)
	if wcs[n].Context != "rx" {
		t.Fatalf("drain completion context %v", wcs[n].Context)
	}
}
