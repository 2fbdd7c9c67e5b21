package rocev2

import (
	"errors"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// sharedCQEnd is an RC end whose sends and receives complete on one CQ,
// as an IPoIB-CM passive QP's do (the drain WR's flush then lands behind
// the receives).
func sharedCQEnd(t *testing.T, d *Device) *rcEnd {
	t.Helper()
	cq := newWaitCQ(t, d, 64)
	qp, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: cq.CQ, RecvCQ: cq.CQ, MaxSendWR: 8, MaxRecvWR: 8, Context: "passive"})
	if err != nil {
		t.Fatal(err)
	}
	return &rcEnd{dev: d, qp: qp, sendCQ: cq, recvCQ: cq}
}

// passivePair connects an RC end on a new device to a sharedCQEnd on
// another, posts receives 1 and 2 on the passive end and sends it message
// 7 (the message buffer is returned for more sends).
func passivePair(t *testing.T, f *testFabric) (a, b *rcEnd, buf, msg []byte) {
	t.Helper()
	a, b = newRCEnd(t, f.newDevice(t), rcOpts{}), sharedCQEnd(t, f.newDevice(t))
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	buf, _ = b.dev.Alloc(64)
	if _, err := b.qp.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}, {ID: 2, Buf: buf}}); err != nil {
		t.Fatal(err)
	}
	msg, _ = a.dev.Alloc(10)
	if _, err := a.qp.PostSend([]hca.SendWR{{ID: 7, Data: msg}}); err != nil {
		t.Fatal(err)
	}
	return a, b, buf, msg
}

// TestNoCompletionProducedAfterDestroy: without faults the backend
// completes synchronously, so once a consumer has drained a QP and
// destroyed it nothing of it ever reaches the CQ again: a packet for it
// is dropped as unknown. Completions the consumer left in the CQ are
// still polled after the destroy (as rxe does) and counted, and so is
// every verb on the destroyed QP.
func TestNoCompletionProducedAfterDestroy(t *testing.T) {
	f := newTestFabric(t, 60, Faults{})
	a, b, buf, msg := passivePair(t, f)
	if wc := b.recvCQ.wait(t, 1)[0]; wc.ID != 1 || wc.Status != hca.StatusSuccess {
		t.Fatalf("receive %+v", wc)
	}
	a.sendCQ.wait(t, 1)
	// Drain: Error flushes receive 2, the drain WR lands behind it.
	mustModify(t, b.qp, hca.QPAttr{State: hca.QPStateError})
	if _, err := b.qp.PostSend([]hca.SendWR{{ID: 99}}); err != nil {
		t.Fatal(err)
	}
	if wcs := b.recvCQ.wait(t, 2); wcs[0].ID != 2 || wcs[1].ID != 99 {
		t.Fatalf("flush and drain %+v", wcs)
	}
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	unknown := b.dev.Stats().Dropped(wire.DropUnknownQP)
	if _, err := a.qp.PostSend([]hca.SendWR{{ID: 8, Data: msg}}); err != nil {
		t.Fatal(err)
	}
	f.waitRx(t, b.dev, func(s Stats) bool { return s.Dropped(wire.DropUnknownQP) > unknown })
	var into [4]hca.WC
	if n := b.recvCQ.Poll(into[:]); n != 0 {
		t.Fatalf("%d completions after destroy: %+v", n, into[:n])
	}
	if s := b.dev.Stats(); s.CompletionsAfterDestroy != 0 || s.CompletionsHeld != 0 {
		t.Fatalf("after destroy %d, held %d; want 0", s.CompletionsAfterDestroy, s.CompletionsHeld)
	}

	verbs := []func() error{
		func() error { _, err := b.qp.PostSend([]hca.SendWR{{ID: 1}}); return err },
		func() error { _, err := b.qp.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}}); return err },
		func() error { return b.qp.Modify(hca.QPAttr{State: hca.QPStateReset}) },
		func() error { return b.qp.AttachMcast(hca.GID{0xff}) },
		func() error { return b.qp.DetachMcast(hca.GID{0xff}) },
		b.qp.Destroy,
	}
	for k, v := range verbs {
		if err := v(); !errors.Is(err, hca.ErrDestroyed) {
			t.Fatalf("verb %d on a destroyed QP: %v", k, err)
		}
	}
	if got := b.dev.Stats().DestroyedQPOps; got != uint64(len(verbs)) {
		t.Fatalf("DestroyedQPOps %d, want %d", got, len(verbs))
	}

	// A consumer that destroys without draining polls the flushes later.
	c := sharedCQEnd(t, b.dev)
	mustModify(t, c.qp, hca.QPAttr{State: hca.QPStateInit})
	if _, err := c.qp.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}, {ID: 2, Buf: buf}, {ID: 3, Buf: buf}}); err != nil {
		t.Fatal(err)
	}
	mustModify(t, c.qp, hca.QPAttr{State: hca.QPStateError})
	if err := c.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if n := c.recvCQ.Poll(into[:]); n != 3 {
		t.Fatalf("polled %d flushes, want 3", n)
	}
	if got := b.dev.Stats().CompletionsAfterDestroy; got != 3 {
		t.Fatalf("CompletionsAfterDestroy %d, want 3", got)
	}
	if o := b.dev.Objects(); o.QPs != 0 || o.CQs != 2 || o.HeldCompletions != 0 {
		t.Fatalf("objects %+v, want 2 CQs and nothing else", o)
	}
}

// TestHeldCompletionArrivesAfterDestroy: with Faults.HoldCompletion a
// receive completion produced before the QP moved to Error can enter the
// CQ after the QP was destroyed, which is the race a consumer's dead flag
// and drain exist for; everything behind it on the CQ (the Error flush,
// the drain WR) still comes after it.
func TestHeldCompletionArrivesAfterDestroy(t *testing.T) {
	f := newTestFabric(t, 61, Faults{Seed: 4, HoldCompletion: 1, HoldCompletionMax: time.Second})
	_, b, _, _ := passivePair(t, f)
	f.waitRx(t, b.dev, func(s Stats) bool { return s.CompletionsHeld == 1 })
	var into [4]hca.WC
	if n := b.recvCQ.Poll(into[:]); n != 0 {
		t.Fatalf("held receive polled at once: %+v", into[:n])
	}
	mustModify(t, b.qp, hca.QPAttr{State: hca.QPStateError})
	if _, err := b.qp.PostSend([]hca.SendWR{{ID: 99}}); err != nil {
		t.Fatal(err)
	}
	if o := b.dev.Objects(); o.HeldCompletions != 3 {
		t.Fatalf("objects %+v: want the receive, the flush and the drain held", o)
	}
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	wcs := b.recvCQ.wait(t, 3)
	if wcs[0].ID != 1 || wcs[0].Status != hca.StatusSuccess || wcs[1].ID != 2 || wcs[1].Status != hca.StatusWRFlushErr || wcs[2].ID != 99 {
		t.Fatalf("completions out of order: %+v", wcs)
	}
	if s := b.dev.Stats(); s.CompletionsAfterDestroy != 3 || s.CompletionsHeld != 3 {
		t.Fatalf("after destroy %d, held %d; want 3, 3", s.CompletionsAfterDestroy, s.CompletionsHeld)
	}
	if o := b.dev.Objects(); o.HeldCompletions != 0 {
		t.Fatalf("objects %+v after release", o)
	}
}

// TestHoldCompletionKeepsOrder: with a fraction of completions held,
// messages still complete in order, some were held, and nothing stays
// held once traffic stops.
func TestHoldCompletionKeepsOrder(t *testing.T) {
	f := newTestFabric(t, 62, Faults{Seed: 9, HoldCompletion: 0.2, HoldCompletionMax: 2 * time.Millisecond})
	a, b := newRCEnd(t, f.newDevice(t), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	sizes := make([]int, 200)
	for i := range sizes {
		sizes[i] = 1 + i*37%5000
	}
	sendAndCheck(t, a, b, sizes)
	if s := b.dev.Stats(); s.CompletionsHeld == 0 || s.RCMessages != uint64(len(sizes)) {
		t.Fatalf("%d completions held, %d RC messages of %d", s.CompletionsHeld, s.RCMessages, len(sizes))
	}
	for _, d := range []*Device{a.dev, b.dev} {
		if o := d.Objects(); o.HeldCompletions != 0 {
			t.Fatalf("%s: %+v", d.Name(), o)
		}
	}
}
