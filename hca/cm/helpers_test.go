package cm

import (
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// ipoibPrivate is the IPoIB-CM private data {UD QPN, 65524}.
func ipoibPrivate(udqpn uint32) []byte {
	return []byte{byte(udqpn >> 24), byte(udqpn >> 16), byte(udqpn >> 8), byte(udqpn), 0, 0, 0xff, 0xf4}
}

// node is one device with a Manager and a CQ for its RC QPs.
type node struct {
	t   testing.TB
	dev *soft.Device
	m   *Manager
	cq  hca.CQ
}

// testOptions keep the timers short: a 20 ms response timeout (code 13,
// 32 ms as cm_convert_to_ms counts it) and packet life time 1 (1 ms).
func testOptions(seed int64) Options {
	return Options{ResponseTimeout: 20 * time.Millisecond, PacketLifeTime: 1, MaxRetries: 15, TimeWait: 10 * time.Millisecond, Seed: seed}
}

// reqInterval is how long a REQ (or the active side's DREQ) of a Manager
// with o waits before it is resent (ib_send_cm_req).
func reqInterval(o Options) time.Duration {
	return 2*convertToMS(o.PacketLifeTime) + convertToMS(timeoutCode(o.ResponseTimeout))
}

func newTestFabric(t testing.TB, faults soft.Faults) *soft.Fabric {
	f := soft.NewFabric(soft.Config{Seed: 1, MTU: hca.MTU4096, Faults: faults})
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("fabric close: %v", err)
		}
	})
	return f
}

func newNode(t testing.TB, f *soft.Fabric, name string, opts Options) *node {
	t.Helper()
	dev, err := f.NewDevice(name)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dev: dev}
	if n.cq, err = dev.CreateCQ(hca.CQConfig{Size: 1 << 14}); err != nil {
		t.Fatal(err)
	}
	n.startManager(opts)
	return n
}

func (n *node) startManager(opts Options) {
	n.t.Helper()
	m, err := NewManager(n.dev, opts)
	if err != nil {
		n.t.Fatal(err)
	}
	n.m = m
	n.t.Cleanup(func() { m.Close() })
}

// rcQP returns a new RC QP in Init.
func (n *node) rcQP() hca.QP {
	n.t.Helper()
	qp, err := n.dev.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		n.t.Fatal(err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit}); err != nil {
		n.t.Fatal(err)
	}
	return qp
}

func (n *node) connect(dst *node, serviceID uint64, h Handler) (*Conn, hca.QP) {
	n.t.Helper()
	qp := n.rcQP()
	c, err := n.m.Connect(ConnectParams{
		DestGID: dst.dev.GID(), ServiceID: serviceID, QP: qp, PathMTU: hca.MTU2048,
		PrivateData: ipoibPrivate(0x48), SRQ: true,
	}, h)
	if err != nil {
		n.t.Fatal(err)
	}
	return c, qp
}

// recorder collects events; its handler never blocks.
type recorder struct {
	mu     sync.Mutex
	events []Event
	byConn map[*Conn][]EventType
	onREP  func(Event)
}

func newRecorder() *recorder { return &recorder{byConn: make(map[*Conn][]EventType)} }

func (r *recorder) handle(ev Event) {
	if ev.Type == EventREPReceived && r.onREP != nil {
		r.onREP(ev)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	r.byConn[ev.Conn] = append(r.byConn[ev.Conn], ev.Type)
}

func (r *recorder) types(c *Conn) []EventType {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]EventType(nil), r.byConn[c]...)
}

func (r *recorder) last(c *Conn) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if r.events[i].Conn == c {
			return r.events[i], true
		}
	}
	return Event{}, false
}

// acceptor is a listener that accepts with fresh QPs and records the
// REQs it saw.
type acceptor struct {
	n    *node
	rec  *recorder
	mu   sync.Mutex
	reqs []*Request
	qps  map[*Conn]hca.QP
	// decide, if set, overrides accepting.
	decide func(*Request) Decision
}

func newAcceptor(n *node) *acceptor {
	return &acceptor{n: n, rec: newRecorder(), qps: make(map[*Conn]hca.QP)}
}

func (a *acceptor) accept(req *Request) Decision {
	a.mu.Lock()
	a.reqs = append(a.reqs, req)
	a.mu.Unlock()
	if a.decide != nil {
		return a.decide(req)
	}
	return a.decision(req)
}

func (a *acceptor) decision(req *Request) Decision {
	qp := a.n.rcQP()
	a.mu.Lock()
	a.qps[req.Conn] = qp
	a.mu.Unlock()
	return Decision{QP: qp, StartingPSN: 0xABCD, PrivateData: ipoibPrivate(0x49), SRQ: true, Handler: a.rec.handle}
}

func (a *acceptor) conns() []*Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	var cs []*Conn
	for _, r := range a.reqs {
		cs = append(cs, r.Conn)
	}
	return cs
}

func eq[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// holdGSI holds the completions of n's GSI CQ: MADs sent to n are
// delivered but its Manager sees none (and none of its own sends
// complete) until the hold is released, which the test's cleanup also
// does.
func holdGSI(t testing.TB, f *soft.Fabric, n *node) *soft.CompletionHold {
	t.Helper()
	h, err := f.HoldCompletions(n.m.cq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Release)
	return h
}
