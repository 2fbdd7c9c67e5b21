package rocev2

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// heldTransmit is a device whose next socket write of a QP given to
// postLSOHeld stops until released: a zero-copy write in progress, for as
// long as a test needs it.
type heldTransmit struct {
	dev     *Device
	arm     atomic.Bool
	inTx    chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHeldTransmit(t *testing.T, f *testFabric) *heldTransmit {
	h := &heldTransmit{dev: f.newDevice(t), inTx: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(h.unblock) // a failing test must not leave the write held
	return h
}

// hold is the write wrapper's hook: the armed write stops.
func (h *heldTransmit) hold() {
	if h.arm.CompareAndSwap(true, false) {
		close(h.inTx)
		<-h.release
	}
}

func (h *heldTransmit) unblock() { h.once.Do(func() { close(h.release) }) }

// udQP is a UD QP of d in RTS with its own CQ.
func udQP(t *testing.T, d *Device) (hca.QP, *waitCQ) {
	t.Helper()
	c := newWaitCQ(t, d, 64)
	q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c.CQ, RecvCQ: c.CQ, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []hca.QPState{hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS} {
		mustModify(t, q, hca.QPAttr{State: s, QKey: testQKey})
	}
	return q, c
}

// postLSOHeld posts a UD LSO send on q (its segments leave without a
// copy) with the write of q's socket held, and returns once the write is in
// progress; the channel reports PostSend's result after the release.
func postLSOHeld(t *testing.T, h *heldTransmit, q hca.QP, to *udEnd) <-chan error {
	t.Helper()
	ah, err := h.dev.CreateAH(to.dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	const mss = 4000
	msg := tcpSuperFrame(15 * mss)
	holdWrites(t, q, h.hold)
	h.arm.Store(true)
	posted := make(chan error, 1)
	go func() {
		_, err := q.PostSend([]hca.SendWR{{ID: 1, Data: msg, AH: ah, RemoteQPN: to.qp.QPN(), RemoteQKey: testQKey, MSS: mss, Flags: hca.SendIPCsum}})
		posted <- err
	}()
	select {
	case <-h.inTx:
	case err := <-posted:
		t.Fatalf("PostSend returned (%v) without a held write", err)
	}
	return posted
}

// TestDestroyDropsCompletionsWaitingForTransmit: a send completion that
// waits behind another QP's zero-copy write in progress (completions
// leave in order) belongs to its QP: once that QP's Destroy returned,
// the completion never reaches its CQ, also after the write is done.
func TestDestroyDropsCompletionsWaitingForTransmit(t *testing.T) {
	f := newTestFabric(t, 65, Faults{})
	h := newHeldTransmit(t, f)
	peer := newUDEnd(t, f.newDevice(t), 64)
	qb, cb := udQP(t, h.dev)
	qa, ca := udQP(t, h.dev)
	posted := postLSOHeld(t, h, qb, peer)
	// No address handle: completes at once in error, behind qb's
	// completion, which waits for the held write.
	if _, err := qa.PostSend([]hca.SendWR{{ID: 9}}); err != nil {
		t.Fatal(err)
	}
	var wc [4]hca.WC
	if n := ca.Poll(wc[:]); n != 0 {
		t.Fatalf("completion %+v overtook the one waiting for the write", wc[0])
	}
	if err := qa.Destroy(); err != nil {
		t.Fatal(err)
	}
	h.unblock()
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	if got := cb.wait(t, 1)[0]; got.ID != 1 || got.Status != hca.StatusSuccess {
		t.Fatalf("LSO send completion %+v", got)
	}
	// qb's and qa's waiting completions are released together, qa's
	// after qb's: had it not been dropped it would be in ca now.
	if n := ca.Poll(wc[:]); n != 0 {
		t.Fatalf("completion %+v of a destroyed QP reached its CQ", wc[0])
	}
	if n := peer.cq.wait(t, 15); len(n) != 15 {
		t.Fatalf("peer got %d segments, want 15", len(n))
	}
}

// TestDestroyWaitsForTransmitWithoutDeviceLock: destroying a QP whose
// send buffer a socket write still reads returns only after that write
// (the buffer is the consumer's again afterwards), and the device
// serves other callers while it waits, also while the close of the QP's
// source socket waits for the write.
func TestDestroyWaitsForTransmitWithoutDeviceLock(t *testing.T) {
	f := newTestFabric(t, 66, Faults{})
	h := newHeldTransmit(t, f)
	peer := newUDEnd(t, f.newDevice(t), 64)
	qb, _ := udQP(t, h.dev)
	posted := postLSOHeld(t, h, qb, peer)
	destroyed := make(chan error, 1)
	go func() { destroyed <- qb.Destroy() }()
	for !qb.(*qp).destroyed.Load() {
		runtime.Gosched()
	}
	// Destroy is past its critical section or inside it: either way a
	// verb that needs the device lock gets it without the write ending.
	served := make(chan struct{})
	go func() {
		h.dev.Port()
		close(served)
	}()
	select {
	case <-served:
	case err := <-destroyed:
		t.Fatalf("Destroy returned (%v) while a socket write reads the QP's buffer", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the device lock is held while Destroy waits for a socket write")
	}
	select {
	case err := <-destroyed:
		t.Fatalf("Destroy returned (%v) while a socket write reads the QP's buffer", err)
	default:
	}
	h.unblock()
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	if _, err := qb.PostSend(nil); !errors.Is(err, hca.ErrDestroyed) {
		t.Fatalf("PostSend after Destroy: %v, want ErrDestroyed", err)
	}
}
