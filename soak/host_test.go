package soak

import (
	"errors"
	"net"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/mutation"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

func TestSoakHostReadBlocksUntilQueuedOrClosed(t *testing.T) {
	var viol soakViolations
	flows := newSoakFlows(2)
	h := newSoakHost(0, 4, 2, flows, &viol)
	bufs := [][]byte{make([]byte, 2048), make([]byte, 2048)}
	sizes := make([]int, 2)
	got := make(chan int)
	go func() {
		n, _ := h.ReadFrames(bufs, sizes)
		got <- n
	}()
	f := h.dataFrame(frame.MAC{2, 0x1b, 0, 0, 0, 1}, 1, 1, 100)
	if !h.enqueue(queuedFrame{b: f, dst: 1}, false, nil) {
		t.Fatal("enqueue refused")
	}
	if n := <-got; n != 1 || sizes[0] != len(f) {
		t.Fatalf("read %d frames, size %d, want 1, %d", n, sizes[0], len(f))
	}
	if s, _ := flows.totals(); s != 1 {
		t.Fatalf("sent %d, want 1", s)
	}
	go func() {
		_, err := h.ReadFrames(bufs, sizes)
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read after close: %v", err)
		}
		got <- 0
	}()
	h.Close()
	<-got
	if h.enqueue(queuedFrame{b: f, dst: 1}, false, nil) {
		t.Fatal("enqueue after close accepted")
	}
	if _, err := h.WriteFrames([][]byte{f}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

func TestSoakHostChecksFrames(t *testing.T) {
	var viol soakViolations
	flows := newSoakFlows(3)
	rx := newSoakHost(1, 4, 8, flows, &viol)
	tx := newSoakHost(0, 4, 8, flows, &viol)
	peerMAC := frame.LocalMAC(5)

	// Two packets of flow 0->1 read by the engine, delivered in order.
	for seq := uint64(1); seq <= 2; seq++ {
		flows.sent(0, 1)
		f := tx.dataFrame(rx.mac, 1, seq, 300)
		copy(f[6:12], peerMAC[:])
		if _, err := rx.WriteFrames([][]byte{f}); err != nil {
			t.Fatal(err)
		}
	}
	if viol.total() != 0 {
		t.Fatalf("good frames flagged: %+v", viol.results())
	}
	// The same packet again: out of order.
	dup := tx.dataFrame(rx.mac, 1, 2, 300)
	rx.WriteFrames([][]byte{dup})
	if viol.count[violOrder].Load() != 1 {
		t.Fatalf("duplicate not flagged: %+v", viol.results())
	}
	// A sequence number the sender never handed over.
	rx.WriteFrames([][]byte{tx.dataFrame(rx.mac, 1, 9, 300)})
	// A corrupted body.
	bad := tx.dataFrame(rx.mac, 1, 3, 300)
	bad[200] ^= 0xff
	rx.WriteFrames([][]byte{bad})
	if viol.count[violPayload].Load() != 2 {
		t.Fatalf("payload violations %d, want 2", viol.count[violPayload].Load())
	}
	// A frame for another host's MAC.
	rx.WriteFrames([][]byte{tx.dataFrame(tx.mac, 1, 4, 300)})
	if viol.count[violBadFrame].Load() != 1 {
		t.Fatalf("misaddressed frame not flagged: %+v", viol.results())
	}
}

func TestSoakHostAnswersAndLearnsARP(t *testing.T) {
	var viol soakViolations
	flows := newSoakFlows(3)
	h := newSoakHost(1, 4, 8, flows, &viol)
	peer := newSoakHost(2, 4, 8, flows, &viol)
	peerMAC := frame.LocalMAC(7)

	// A request for our address, as the engine delivers it: from the
	// peer's mapped MAC.
	req := peer.arpRequest(h.ip)
	copy(req[6:12], peerMAC[:])
	copy(req[frame.EthHdrLen+8:], peerMAC[:])
	h.WriteFrames([][]byte{req})
	if h.queued() != 1 || h.ctr.arpRequestsAnswered.Load() != 1 {
		t.Fatalf("request not answered: %d queued", h.queued())
	}
	bufs, sizes := [][]byte{make([]byte, 128)}, []int{0}
	h.ReadFrames(bufs, sizes)
	eth, err := frame.ParseEthernet(bufs[0][:sizes[0]])
	if err != nil || eth.Dst != peerMAC || eth.EtherType != frame.EtherTypeARP {
		t.Fatalf("reply header %+v %v", eth, err)
	}
	a, err := frame.ParseEthARP(bufs[0][frame.EthHdrLen:sizes[0]])
	if err != nil || a.Op != frame.ARPReply || a.SenderMAC != h.mac || a.TargetMAC != peerMAC || a.TargetIP != peer.ip {
		t.Fatalf("reply %+v %v", a, err)
	}

	// A reply to us is learned; a later one with another MAC is flagged.
	reply := func(mac frame.MAC) []byte {
		b := make([]byte, frame.EthHdrLen+frame.EthARPLen)
		frame.PutEthernet(b, frame.EthHeader{Dst: h.mac, Src: mac, EtherType: frame.EtherTypeARP})
		r := frame.EthARP{ARP: frame.ARP{Op: frame.ARPReply, SenderIP: peer.ip, TargetIP: h.ip}, SenderMAC: mac, TargetMAC: h.mac}
		r.Marshal(b[frame.EthHdrLen:])
		return b
	}
	h.WriteFrames([][]byte{reply(peerMAC)})
	if m, ok := h.lookupARP(peer.ip); !ok || m != peerMAC {
		t.Fatalf("learned %s %v", m, ok)
	}
	h.WriteFrames([][]byte{reply(frame.LocalMAC(8))})
	if viol.count[violBadFrame].Load() != 1 {
		t.Fatalf("MAC change not flagged: %+v", viol.results())
	}
}

// TestVerbsWatch drives the dead-flag check by hand: a receive
// completion of a QP moved to Error before the poll must not reach the
// host; one still undelivered at the next poll was recycled.
func TestVerbsWatch(t *testing.T) {
	var viol soakViolations
	w := newVerbsWatch(0, &viol, mutation.Soak{})
	cq := &watchedCQ{w: w}
	ctx := new(int)
	// An SRQ buffer with headroom in front, as the engine posts it, and
	// the frame it writes from it in place.
	buf := make([]byte, 64)
	w.posted(nil, true, []hca.RecvWR{{ID: 7, Buf: buf[10:]}})
	inPlace := [][]byte{buf[:40]}
	wc := hca.WC{ID: 7, Opcode: hca.WCRecv, Context: ctx}

	// Before teardown: nothing is expected.
	w.note(cq, []hca.WC{wc}, w.epoch.Load())
	w.delivered(inPlace)
	w.settle(cq)
	if viol.total() != 0 || w.checked.Load() != 0 {
		t.Fatalf("live completion: violations %d, checked %d", viol.total(), w.checked.Load())
	}
	// Teardown began, the completion is recycled (not written): fine.
	w.doom(ctx)
	w.note(cq, []hca.WC{wc}, w.epoch.Load())
	w.delivered([][]byte{make([]byte, 40)}) // another buffer's frame
	w.settle(cq)
	if viol.total() != 0 || w.checked.Load() != 1 {
		t.Fatalf("recycled completion: violations %d, checked %d", viol.total(), w.checked.Load())
	}
	// A poll that began before the Modify is not held to it.
	other := new(int)
	ring := make([]byte, 64)
	w.posted(other, false, []hca.RecvWR{{ID: 8, Buf: ring[10:]}})
	start := w.epoch.Load()
	w.doom(other)
	w.note(cq, []hca.WC{{ID: 8, Opcode: hca.WCRecv, Context: other}}, start)
	w.delivered([][]byte{ring[:30]})
	w.settle(cq)
	if viol.total() != 0 {
		t.Fatal("completion of a poll older than the teardown flagged")
	}
	// Delivered instead of recycled: a violation.
	w.note(cq, []hca.WC{wc}, w.epoch.Load())
	w.delivered(inPlace)
	if viol.count[violDeadDelivered].Load() != 1 || w.violated.Load() != 1 {
		t.Fatalf("delivered dead completion not flagged: %+v", viol.results())
	}
	w.settle(cq)
	if w.checked.Load() != 1 {
		t.Fatalf("a delivered completion counted as recycled too: checked %d", w.checked.Load())
	}
	// Sends (the drain WR) are never held to it.
	w.note(cq, []hca.WC{{ID: 7, Opcode: hca.WCSend, Context: ctx}}, w.epoch.Load())
	w.delivered(inPlace)
	w.settle(cq)
	if viol.total() != 1 {
		t.Fatal("send completion flagged")
	}
}
