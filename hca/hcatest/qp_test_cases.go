package hcatest

import (
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func testQPNUnique(t *testing.T, f Fabric) {
	dev := f.NewDevice(t)
	cq := newCQ(t, f, dev, 16)
	live := map[hca.QPN]hca.QP{}
	create := func(typ hca.QPType) {
		qp, err := dev.CreateQP(hca.QPConfig{Type: typ, SendCQ: cq.CQ, RecvCQ: cq.CQ, MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			t.Fatalf("create QP: %v", err)
		}
		n := qp.QPN()
		if _, dup := live[n]; dup || n <= hca.QPNGSI || n >= hca.QPNMulticast {
			t.Fatalf("QPN %#x duplicate (%v) or reserved", n, dup)
		}
		live[n] = qp
	}
	for i := range 300 {
		create([]hca.QPType{hca.QPTypeRC, hca.QPTypeUD}[i%2])
	}
	i := 0
	for n, qp := range live {
		if i%3 == 0 {
			if err := qp.Destroy(); err != nil {
				t.Fatalf("destroy: %v", err)
			}
			delete(live, n)
		}
		i++
	}
	for range 200 {
		create(hca.QPTypeRC)
	}
}

func testAfterDestroy(t *testing.T, f Fabric) {
	const n = 3
	type connCtx struct{ id int }
	ctxB := &connCtx{id: 42}
	a, b := rcPair(t, f, qpOpts{}, qpOpts{ctx: ctxB})
	buf := alloc(t, b.dev, n*16)
	for i := range n {
		postRecv(t, b.qp, hca.RecvWR{ID: uint64(i), Buf: buf[i*16 : i*16+16]})
	}
	msg := alloc(t, a.dev, 8)
	for i := range n {
		postSend(t, a.qp, hca.SendWR{ID: uint64(i), Data: msg})
	}
	a.sendCQ.wait(t, n)
	qpn := b.qp.QPN()
	if err := b.qp.Destroy(); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if err := b.qp.Modify(hca.QPAttr{State: hca.QPStateError}); !isErr(err, hca.ErrDestroyed) {
		t.Fatalf("modify of a destroyed QP: %v, want ErrDestroyed", err)
	}
	if _, err := b.qp.PostRecv([]hca.RecvWR{{ID: 9, Buf: buf}}); !isErr(err, hca.ErrDestroyed) {
		t.Fatalf("post recv on a destroyed QP: %v, want ErrDestroyed", err)
	}
	if _, err := b.qp.PostSend([]hca.SendWR{{ID: 9, Data: msg}}); !isErr(err, hca.ErrDestroyed) {
		t.Fatalf("post send on a destroyed QP: %v, want ErrDestroyed", err)
	}
	if err := b.qp.AttachMcast(testMGID); !isErr(err, hca.ErrDestroyed) {
		t.Fatalf("attach on a destroyed QP: %v, want ErrDestroyed", err)
	}
	if f.Properties().PurgesCompletionsOnDestroy {
		if got := b.recvCQ.pollNow(); len(got) != 0 {
			t.Fatalf("backend purges on destroy but left %+v", got)
		}
		return
	}
	for i, wc := range b.recvCQ.wait(t, n) {
		expectWC(t, wc, uint64(i), hca.StatusSuccess, hca.WCRecv)
		if wc.Context != ctxB || wc.QPN != qpn {
			t.Fatalf("completion after destroy %+v lacks the context", wc)
		}
	}
}

var allStates = []hca.QPState{hca.QPStateReset, hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS, hca.QPStateError}

// driveTo moves a fresh QP from Reset to s along legal transitions.
func driveTo(t *testing.T, qp hca.QP, peer hca.GID, s hca.QPState) {
	t.Helper()
	path := map[hca.QPState][]hca.QPState{
		hca.QPStateReset: nil,
		hca.QPStateInit:  {hca.QPStateInit},
		hca.QPStateRTR:   {hca.QPStateInit, hca.QPStateRTR},
		hca.QPStateRTS:   {hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS},
		hca.QPStateError: {hca.QPStateError},
	}[s]
	for _, st := range path {
		modify(t, qp, transitionAttr(st, peer))
	}
	expectState(t, qp, s)
}

func transitionAttr(s hca.QPState, peer hca.GID) hca.QPAttr {
	return hca.QPAttr{State: s, QKey: testQKey, DestQPN: 0x10, DestGID: peer, PathMTU: hca.MTU1024, MinRNRTimer: 1, Timeout: 1}
}

func testTransitions(t *testing.T, f Fabric) {
	dev := f.NewDevice(t)
	cq := newCQ(t, f, dev, 64)
	peer := dev.Port().GID
	for _, typ := range []hca.QPType{hca.QPTypeRC, hca.QPTypeUD} {
		for _, from := range allStates {
			for _, to := range allStates {
				qp, err := dev.CreateQP(hca.QPConfig{Type: typ, SendCQ: cq.CQ, RecvCQ: cq.CQ, MaxSendWR: 4, MaxRecvWR: 4})
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				driveTo(t, qp, peer, from)
				err = qp.Modify(transitionAttr(to, peer))
				want := hca.CheckTransition(typ, from, to)
				switch {
				case want == nil && err != nil:
					t.Errorf("%s %s -> %s: %v, want success", typ, from, to, err)
				case want == nil:
					expectState(t, qp, to)
				case !isErr(err, hca.ErrIllegalTransition):
					t.Errorf("%s %s -> %s: %v, want ErrIllegalTransition", typ, from, to, err)
				default:
					expectState(t, qp, from)
				}
				if err := qp.Destroy(); err != nil {
					t.Fatalf("destroy: %v", err)
				}
			}
		}
	}
}

func testPostWrongState(t *testing.T, f Fabric) {
	dev := f.NewDevice(t)
	e := newEndpoint(t, f, dev, hca.QPTypeRC, qpOpts{})
	buf := alloc(t, dev, 16)
	if _, err := e.qp.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}}); !isErr(err, hca.ErrInvalidState) {
		t.Fatalf("post recv in Reset: %v, want ErrInvalidState", err)
	}
	modify(t, e.qp, hca.QPAttr{State: hca.QPStateInit})
	if _, err := e.qp.PostSend([]hca.SendWR{{ID: 1, Data: buf}}); !isErr(err, hca.ErrInvalidState) {
		t.Fatalf("post send in Init: %v, want ErrInvalidState", err)
	}
	postRecv(t, e.qp, hca.RecvWR{ID: 1, Buf: buf}) // Init accepts receives
	srq, err := dev.CreateSRQ(hca.SRQConfig{MaxWR: 2})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	s := newEndpoint(t, f, dev, hca.QPTypeRC, qpOpts{srq: srq})
	modify(t, s.qp, hca.QPAttr{State: hca.QPStateInit})
	if _, err := s.qp.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}}); err == nil {
		t.Fatalf("post recv on an SRQ-attached QP succeeded")
	}
	if err := srq.Destroy(); !isErr(err, hca.ErrBusy) {
		t.Fatalf("destroy of an SRQ in use: %v, want ErrBusy", err)
	}
	if err := e.sendCQ.Destroy(); !isErr(err, hca.ErrBusy) {
		t.Fatalf("destroy of a CQ in use: %v, want ErrBusy", err)
	}
}

// testReentrant checks that completion and async handlers may call back
// into Poll, Notify, PostSend, Modify and Destroy without deadlock.
func testReentrant(t *testing.T, f Fabric) {
	const rounds = 20
	da, db := f.NewDevice(t), f.NewDevice(t)
	msg := alloc(t, da, 8)
	var (
		mu        sync.Mutex
		scq       hca.CQ
		sender    hca.QP
		sent      int
		completed int
		pingsDone = make(chan struct{})
	)
	// The send CQ's handler polls, posts the next send and re-arms.
	onSend := func() {
		mu.Lock()
		defer mu.Unlock()
		wcs := make([]hca.WC, 8)
		for completed < rounds {
			n := scq.Poll(wcs)
			for _, wc := range wcs[:n] {
				if wc.Status != hca.StatusSuccess {
					t.Errorf("completion %+v", wc)
				}
				completed++
				if sent < rounds {
					if _, err := sender.PostSend([]hca.SendWR{{ID: uint64(sent), Data: msg}}); err != nil {
						t.Errorf("post send from a completion handler: %v", err)
						return
					}
					sent++
				}
			}
			if completed == rounds {
				close(pingsDone)
				return
			}
			if n == 0 && !scq.Notify(true) {
				return
			}
		}
	}
	var err error
	if scq, err = da.CreateCQ(hca.CQConfig{Size: 64, OnCompletion: onSend}); err != nil {
		t.Fatalf("create CQ: %v", err)
	}
	sw := &cqWaiter{CQ: scq, wake: make(chan struct{}, 1), events: newEventLog(), timeout: timeout(f)}

	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: rounds})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	var (
		rcq       hca.CQ
		receiver  hca.QP
		destroyed = make(chan error, 1)
	)
	// The receive CQ's handler destroys the QP once it sees the drain.
	onRecv := func() {
		wcs := make([]hca.WC, 8)
		for {
			n := rcq.Poll(wcs)
			for _, wc := range wcs[:n] {
				if wc.ID == 0xffffffff {
					destroyed <- receiver.Destroy()
					return
				}
			}
			if n == 0 && !rcq.Notify(true) {
				return
			}
		}
	}
	if rcq, err = db.CreateCQ(hca.CQConfig{Size: 64, OnCompletion: onRecv}); err != nil {
		t.Fatalf("create CQ: %v", err)
	}
	rw := &cqWaiter{CQ: rcq, wake: make(chan struct{}, 1), events: newEventLog(), timeout: timeout(f)}
	// The LAST_WQE handler modifies its QP again and posts the drain.
	onEvent := func(ev hca.AsyncEvent) {
		if ev.Type != hca.EventQPLastWQEReached {
			return
		}
		if err := receiver.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
			t.Errorf("modify from an event handler: %v", err)
		}
		if _, err := receiver.PostSend([]hca.SendWR{{ID: 0xffffffff}}); err != nil {
			t.Errorf("post drain from an event handler: %v", err)
		}
	}
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{sendCQ: sw, recvCQ: sw})
	b := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq, sendCQ: rw, recvCQ: rw, onEvent: onEvent})
	connect(t, a, b, qpOpts{rnrRetry: 7}, qpOpts{minRNR: 1})
	sender, receiver = a.qp, b.qp
	buf := alloc(t, db, rounds*8)
	for i := range rounds {
		postRecv(t, srq, hca.RecvWR{ID: uint64(i), Buf: buf[i*8 : i*8+8]})
	}
	rcq.Notify(false)
	mu.Lock()
	scq.Notify(false)
	postSend(t, sender, hca.SendWR{ID: 0, Data: msg})
	sent = 1
	mu.Unlock()
	waitSignal(t, f, pingsDone, "20 sends driven from the completion handler")

	modify(t, receiver, hca.QPAttr{State: hca.QPStateError})
	g := make(chan struct{})
	var derr error
	go func() { derr = <-destroyed; close(g) }()
	waitSignal(t, f, g, "destroy from the receive completion handler")
	if derr != nil {
		t.Fatalf("destroy from a completion handler: %v", derr)
	}
}

func testLink(t *testing.T, f Fabric) {
	lf, ok := f.(LinkFabric)
	if !ok {
		t.Skip("backend has no link control (LinkFabric)")
	}
	a, b := rcPair(t, f, qpOpts{}, qpOpts{})
	portEvents := newEventLog()
	cancel := a.dev.OnPortEvent(portEvents.record)
	defer cancel()
	lf.SetLinkUp(t, a.dev, false)
	portEvents.waitFor(t, timeout(f), hca.EventPortErr, 0)
	if a.dev.Port().Active {
		t.Fatalf("port active after link down")
	}
	postRecv(t, b.qp, hca.RecvWR{ID: 1, Buf: alloc(t, b.dev, 64)})
	postSend(t, a.qp, hca.SendWR{ID: 2, Data: alloc(t, a.dev, 16)})
	expectWC(t, a.sendCQ.wait(t, 1)[0], 2, hca.StatusRetryExcErr, hca.WCSend)
	expectState(t, a.qp, hca.QPStateError)

	udOK := !f.Properties().LossyUD
	var u, v *endpoint
	var ah hca.AH
	if udOK {
		u = newEndpoint(t, f, a.dev, hca.QPTypeUD, qpOpts{})
		v = newEndpoint(t, f, b.dev, hca.QPTypeUD, qpOpts{})
		udUp(t, u, testQKey, 0)
		udUp(t, v, testQKey, 0)
		ah = createAH(t, a.dev, b.dev.Port().GID)
		postRecv(t, v.qp, hca.RecvWR{ID: 1, Buf: alloc(t, b.dev, 256)}, hca.RecvWR{ID: 2, Buf: alloc(t, b.dev, 256)})
		// Sent while the link is down: it completes but never arrives.
		postSend(t, u.qp, hca.SendWR{ID: 1, Data: alloc(t, a.dev, 10), AH: ah, RemoteQPN: v.qp.QPN(), RemoteQKey: testQKey})
		u.sendCQ.wait(t, 1)
	}
	lf.SetLinkUp(t, a.dev, true)
	portEvents.waitFor(t, timeout(f), hca.EventPortActive, 0)
	if !a.dev.Port().Active {
		t.Fatalf("port down after link up")
	}
	if udOK {
		postSend(t, u.qp, hca.SendWR{ID: 2, Data: alloc(t, a.dev, 20), AH: ah, RemoteQPN: v.qp.QPN(), RemoteQKey: testQKey})
		wc := v.recvCQ.wait(t, 1)[0]
		if wc.Status != hca.StatusSuccess || wc.ByteLen != 20 {
			t.Fatalf("after link up received %+v; want only the 20-byte packet", wc)
		}
		if got := v.recvCQ.pollNow(); len(got) != 0 {
			t.Fatalf("extra receives %+v", got)
		}
	}
}
