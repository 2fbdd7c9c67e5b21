package hcatest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

func timeout(f Fabric) time.Duration {
	if d := f.Properties().WaitTimeout; d > 0 {
		return d
	}
	return 10 * time.Second
}

// cqWaiter is a CQ whose completion handler signals a channel, so tests can
// wait for completions without sleeping.
type cqWaiter struct {
	hca.CQ
	wake    chan struct{}
	fires   atomic.Int64
	arms    atomic.Int64
	events  *eventLog
	timeout time.Duration
}

func newCQ(t *testing.T, f Fabric, dev hca.Device, size int) *cqWaiter {
	t.Helper()
	w := &cqWaiter{wake: make(chan struct{}, 1), events: newEventLog(), timeout: timeout(f)}
	cq, err := dev.CreateCQ(hca.CQConfig{
		Size: size,
		OnCompletion: func() {
			w.fires.Add(1)
			select {
			case w.wake <- struct{}{}:
			default:
			}
		},
		OnEvent: w.events.record,
	})
	if err != nil {
		t.Fatalf("create CQ: %v", err)
	}
	w.CQ = cq
	return w
}

func (w *cqWaiter) Notify(reportMissed bool) bool {
	w.arms.Add(1)
	return w.CQ.Notify(reportMissed)
}

// wait returns exactly n completions, in CQ order.
func (w *cqWaiter) wait(t *testing.T, n int) []hca.WC {
	t.Helper()
	out := make([]hca.WC, 0, n)
	buf := make([]hca.WC, 64)
	guard := time.NewTimer(w.timeout)
	defer guard.Stop()
	for len(out) < n {
		k := w.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if k > 0 || w.Notify(true) {
			continue
		}
		select {
		case <-w.wake:
		case <-guard.C:
			t.Fatalf("timed out after %v waiting for %d completions; got %d: %+v", w.timeout, n, len(out), out)
		}
	}
	return out
}

// pollNow returns whatever is queued right now.
func (w *cqWaiter) pollNow() []hca.WC {
	var out []hca.WC
	buf := make([]hca.WC, 64)
	for {
		k := w.Poll(buf)
		if k == 0 {
			return out
		}
		out = append(out, buf[:k]...)
	}
}

// eventLog records async events and signals each arrival.
type eventLog struct {
	mu     sync.Mutex
	events []hca.AsyncEvent
	wake   chan struct{}
}

func newEventLog() *eventLog { return &eventLog{wake: make(chan struct{}, 1)} }

func (l *eventLog) record(ev hca.AsyncEvent) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *eventLog) count(typ hca.EventType, qpn hca.QPN) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.events {
		if ev.Type == typ && ev.QPN == qpn {
			n++
		}
	}
	return n
}

// waitFor blocks until an event of typ for qpn has been recorded.
func (l *eventLog) waitFor(t *testing.T, d time.Duration, typ hca.EventType, qpn hca.QPN) hca.AsyncEvent {
	t.Helper()
	guard := time.NewTimer(d)
	defer guard.Stop()
	for {
		l.mu.Lock()
		for _, ev := range l.events {
			if ev.Type == typ && ev.QPN == qpn {
				l.mu.Unlock()
				return ev
			}
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-guard.C:
			t.Fatalf("timed out after %v waiting for %s on QPN %#x", d, typ, qpn)
		}
	}
}

func alloc(t *testing.T, dev hca.Device, n int) []byte {
	t.Helper()
	b, err := dev.Alloc(n)
	if err != nil {
		t.Fatalf("alloc %d: %v", n, err)
	}
	return b
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*31 + i*7 + i>>8)
	}
}

// qpOpts are the knobs tests turn on QPs.
type qpOpts struct {
	srq       hca.SRQ
	ctx       any
	onEvent   func(hca.AsyncEvent)
	maxSend   int
	maxRecv   int
	retry     uint8
	rnrRetry  uint8
	minRNR    uint8
	pkeyIndex int
	qkey      hca.QKey
	sameCQ    bool // send and receive on one CQ, as IPoIB's RX QPs do
	sendCQ    *cqWaiter
	recvCQ    *cqWaiter
	cqSize    int
}

// endpoint is a QP with its CQs.
type endpoint struct {
	dev    hca.Device
	qp     hca.QP
	sendCQ *cqWaiter
	recvCQ *cqWaiter
	events *eventLog
}

func newEndpoint(t *testing.T, f Fabric, dev hca.Device, typ hca.QPType, o qpOpts) *endpoint {
	t.Helper()
	size := o.cqSize
	if size == 0 {
		size = 1024
	}
	e := &endpoint{dev: dev, sendCQ: o.sendCQ, recvCQ: o.recvCQ, events: newEventLog()}
	if e.sendCQ == nil {
		e.sendCQ = newCQ(t, f, dev, size)
	}
	if e.recvCQ == nil {
		e.recvCQ = e.sendCQ
		if !o.sameCQ {
			e.recvCQ = newCQ(t, f, dev, size)
		}
	}
	onEvent := e.events.record
	if o.onEvent != nil {
		onEvent = func(ev hca.AsyncEvent) { e.events.record(ev); o.onEvent(ev) }
	}
	ms, mr := o.maxSend, o.maxRecv
	if ms == 0 {
		ms = 256
	}
	if mr == 0 {
		mr = 256
	}
	qp, err := dev.CreateQP(hca.QPConfig{
		Type: typ, SendCQ: e.sendCQ.CQ, RecvCQ: e.recvCQ.CQ, SRQ: o.srq,
		MaxSendWR: ms, MaxRecvWR: mr, Context: o.ctx, OnEvent: onEvent,
	})
	if err != nil {
		t.Fatalf("create %s QP: %v", typ, err)
	}
	e.qp = qp
	return e
}

func modify(t *testing.T, qp hca.QP, attr hca.QPAttr) {
	t.Helper()
	if err := qp.Modify(attr); err != nil {
		t.Fatalf("modify QP %#x to %s: %v", qp.QPN(), attr.State, err)
	}
}

// connect brings two RC endpoints to RTS, connected to each other.
func connect(t *testing.T, a, b *endpoint, oa, ob qpOpts) {
	t.Helper()
	half := func(x, y *endpoint, o, peer qpOpts) {
		modify(t, x.qp, hca.QPAttr{State: hca.QPStateInit, PKeyIndex: o.pkeyIndex})
		modify(t, x.qp, hca.QPAttr{State: hca.QPStateRTR, DestQPN: y.qp.QPN(), DestGID: y.dev.Port().GID,
			PathMTU: x.dev.Port().ActiveMTU, MinRNRTimer: o.minRNR})
	}
	half(a, b, oa, ob)
	half(b, a, ob, oa)
	modify(t, a.qp, hca.QPAttr{State: hca.QPStateRTS, RetryCount: oa.retry, RNRRetry: oa.rnrRetry, Timeout: 1})
	modify(t, b.qp, hca.QPAttr{State: hca.QPStateRTS, RetryCount: ob.retry, RNRRetry: ob.rnrRetry, Timeout: 1})
}

// rcPair makes a connected RC sender on one device and receiver on another.
func rcPair(t *testing.T, f Fabric, oa, ob qpOpts) (a, b *endpoint) {
	t.Helper()
	da, db := f.NewDevice(t), f.NewDevice(t)
	a = newEndpoint(t, f, da, hca.QPTypeRC, oa)
	b = newEndpoint(t, f, db, hca.QPTypeRC, ob)
	connect(t, a, b, oa, ob)
	return a, b
}

// udUp brings a UD QP to RTS with Q_Key qkey.
func udUp(t *testing.T, e *endpoint, qkey hca.QKey, pkeyIndex int) {
	t.Helper()
	modify(t, e.qp, hca.QPAttr{State: hca.QPStateInit, QKey: qkey, PKeyIndex: pkeyIndex})
	modify(t, e.qp, hca.QPAttr{State: hca.QPStateRTR})
	modify(t, e.qp, hca.QPAttr{State: hca.QPStateRTS})
}

func postRecv(t *testing.T, r interface {
	PostRecv([]hca.RecvWR) (int, error)
}, wrs ...hca.RecvWR) {
	t.Helper()
	if n, err := r.PostRecv(wrs); err != nil || n != len(wrs) {
		t.Fatalf("post recv: %d of %d: %v", n, len(wrs), err)
	}
}

func postSend(t *testing.T, qp hca.QP, wrs ...hca.SendWR) {
	t.Helper()
	if n, err := qp.PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("post send on QP %#x: %d of %d: %v", qp.QPN(), n, len(wrs), err)
	}
}

func expectWC(t *testing.T, wc hca.WC, id uint64, st hca.Status, op hca.WCOpcode) {
	t.Helper()
	if wc.ID != id || wc.Status != st || wc.Opcode != op {
		t.Fatalf("completion %+v; want id %d status %q opcode %s", wc, id, st, op)
	}
}

func expectState(t *testing.T, qp hca.QP, s hca.QPState) {
	t.Helper()
	if got := qp.State(); got != s {
		t.Fatalf("QP %#x state %s, want %s", qp.QPN(), got, s)
	}
}

func isErr(err, target error) bool { return err != nil && errors.Is(err, target) }
