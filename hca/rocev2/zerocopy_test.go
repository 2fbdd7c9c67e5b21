package rocev2

import (
	"bytes"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
)

// heldRawConn is a socket's RawConn whose writes first run before,
// inside the write (the descriptor in use, so a Close of the socket waits
// for it) and with Device.txMu held: a test holds a transmit in progress
// there.
type heldRawConn struct {
	syscall.RawConn
	before func()
}

func (c heldRawConn) Write(f func(fd uintptr) bool) error {
	held := false
	return c.RawConn.Write(func(fd uintptr) bool {
		if !held {
			held = true
			c.before()
		}
		return f(fd)
	})
}

// holdWrites makes before run ahead of every write of the source socket
// q sends from, which must be its own (not the fabric port's, which the
// receive path also uses).
func holdWrites(t *testing.T, q hca.QP, before func()) {
	t.Helper()
	qq := q.(*qp)
	d := qq.dev
	d.mu.Lock()
	s := qq.src
	d.mu.Unlock()
	if s == nil || s == d.sock {
		t.Fatal("QP sends from the fabric port, not a source socket of its own")
	}
	d.txMu.Lock()
	s.raw = heldRawConn{RawConn: s.raw, before: before}
	d.txMu.Unlock()
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
	da := f.newDevice(t)
	b := newUDEnd(t, f.newDevice(t), 64)
	c := newWaitCQ(t, da, 64)
	qa, err := da.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c.CQ, RecvCQ: c.CQ, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	holdWrites(t, qa, func() {
		transmits.Add(1)
		if c := sendCQ.Load(); c != nil {
			var wc [4]hca.WC
			if c.Poll(wc[:]) > 0 {
				early.Add(1)
			}
		}
	})
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
	if s := da.Stats(); s.TxGSOMessages == 0 || s.TxZeroCopy != 15 {
		t.Fatalf("segments not sent as one GSO message, or not all 15 without a copy: %+v", s)
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
	da := f.newDevice(t)
	a, b := newRCEnd(t, da, rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	holdWrites(t, a.qp, func() {
		if hold.CompareAndSwap(true, false) {
			close(inTx)
			<-release
		}
	})
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

// idleTap records the packets it is shown while not idle.
type idleTap struct {
	idle atomic.Bool
	mu   sync.Mutex
	sent [][]byte // packets from the device's own address
	from netip.Addr
}

func (x *idleTap) Idle() bool { return x.idle.Load() }

func (x *idleTap) Datagram(src, _ netip.AddrPort, pkt []byte) {
	if x.idle.Load() || src.Addr() != x.from {
		return
	}
	x.mu.Lock()
	x.sent = append(x.sent, append([]byte(nil), pkt...))
	x.mu.Unlock()
}

// TestZeroCopyOnlyWhileTapIdle: RC packets go without a copy while the
// device's tap (ipoib up always has one, for ipoib capture) is idle; with
// a capture attached they are copied whole, so the tap sees each packet
// in one piece.
func TestZeroCopyOnlyWhileTapIdle(t *testing.T) {
	f := newTestFabric(t, 64, Faults{})
	cfg := f.config(t)
	tap := &idleTap{from: cfg.Bind.Addr()}
	tap.idle.Store(true)
	cfg.Tap = tap
	a, b := newRCEnd(t, f.open(t, cfg), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	sendAndCheck(t, a, b, []int{65520})
	if n := a.dev.Stats().TxZeroCopy; n != 16 {
		t.Fatalf("idle tap: %d zero-copy datagrams, want the message's 16", n)
	}
	tap.idle.Store(false)
	sendAndCheck(t, a, b, []int{65520})
	if n := a.dev.Stats().TxZeroCopy; n != 16 {
		t.Fatalf("capturing tap: %d zero-copy datagrams, want none more than 16", n)
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	data := 0
	for _, p := range tap.sent {
		if len(p) > 1000 {
			data++
		}
	}
	if data != 16 {
		t.Fatalf("tap saw %d data packets of the second message, want 16", data)
	}
}
