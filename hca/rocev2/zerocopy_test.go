package rocev2

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
)

// openHooked opens a device of f with h's beforeTransmit.
func (f *testFabric) openHooked(t *testing.T, before func()) *Device {
	t.Helper()
	cfg := f.config(t)
	for _, d := range f.devs {
		cfg.Peers = append(cfg.Peers, d.LocalAddr().Addr())
	}
	d, err := newDevice(cfg, hooks{beforeTransmit: before})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range f.devs {
		o.AddPeer(d.LocalAddr().Addr())
	}
	f.devs = append(f.devs, d)
	return d
}

// TestZeroCopyLSOCompletesAfterTransmit: UD LSO segments leave from the
// work request's buffer without a copy, so the send completion (which
// gives the buffer back) is not in the CQ while the socket write of the
// segments is still to come; the segments arrive as SegmentInto cuts
// them.
func TestZeroCopyLSOCompletesAfterTransmit(t *testing.T) {
	f := newTestFabric(t, 62, Faults{})
	var sendCQ atomic.Pointer[waitCQ]
	var early, transmits atomic.Int32
	da := f.openHooked(t, func() {
		transmits.Add(1)
		if c := sendCQ.Load(); c != nil {
			var wc [4]hca.WC
			if c.Poll(wc[:]) > 0 {
				early.Add(1)
			}
		}
	})
	b := newUDEnd(t, f.newDevice(t), 64)
	c := newWaitCQ(t, da, 64)
	qa, err := da.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c.CQ, RecvCQ: c.CQ, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []hca.QPState{hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS} {
		mustModify(t, qa, hca.QPAttr{State: s, QKey: testQKey})
	}
	ah, err := da.CreateAH(b.dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	const mss = 4000
	msg := tcpSuperFrame(15 * mss)
	sendCQ.Store(c)
	if _, err := qa.PostSend([]hca.SendWR{{ID: 7, Data: msg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey, MSS: mss, Flags: hca.SendIPCsum}}); err != nil {
		t.Fatal(err)
	}
	sendCQ.Store(nil)
	if transmits.Load() == 0 || early.Load() != 0 {
		t.Fatalf("%d transmits; %d saw the send completion before the segments were on the socket", transmits.Load(), early.Load())
	}
	if wc := c.wait(t, 1)[0]; wc.ID != 7 || wc.Status != hca.StatusSuccess {
		t.Fatalf("send completion %+v", wc)
	}
	h, err := offload.Parse(msg, hca.OffloadL3Offset)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4096)
	for i, wc := range b.cq.wait(t, 15) {
		n, err := h.SegmentInto(want, msg, mss, i, true)
		if err != nil {
			t.Fatal(err)
		}
		if wc.Status != hca.StatusSuccess || wc.Flags&hca.WCIPCsumOK == 0 || !bytes.Equal(b.buf[wc.ID][:wc.ByteLen], want[:n]) {
			t.Fatalf("segment %d: %+v, bytes differ from SegmentInto's", i, wc)
		}
	}
	if s := da.Stats(); s.TxGSOMessages == 0 {
		t.Fatalf("segments not sent as one GSO message: %+v", s)
	}
}

// TestZeroCopyRCFlushWaitsForTransmit: an RC QP moved to Error while a
// socket write still reads its message's buffer gives the flush
// completion only once that write is done; the write finishes and the
// completion follows.
func TestZeroCopyRCFlushWaitsForTransmit(t *testing.T) {
	f := newTestFabric(t, 63, Faults{})
	inTx, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // a failing test must not leave the transmit held
	var hold atomic.Bool
	da := f.openHooked(t, func() {
		if hold.CompareAndSwap(true, false) {
			close(inTx)
			<-release
		}
	})
	a, b := newRCEnd(t, da, rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	msg, _ := da.Alloc(65520)
	hold.Store(true)
	posted := make(chan error, 1)
	go func() {
		_, err := a.qp.PostSend([]hca.SendWR{{ID: 3, Data: msg}})
		posted <- err
	}()
	<-inTx
	mustModify(t, a.qp, hca.QPAttr{State: hca.QPStateError})
	var wc [4]hca.WC
	if n := a.sendCQ.Poll(wc[:]); n != 0 {
		t.Fatalf("flush completion %+v delivered while the socket write of its buffer is in progress", wc[0])
	}
	unblock()
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	if got := a.sendCQ.wait(t, 1)[0]; got.ID != 3 || got.Status != hca.StatusWRFlushErr {
		t.Fatalf("completion %+v, want WR 3 flushed", got)
	}
}
