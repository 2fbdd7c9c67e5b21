package rocev2

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

func TestFaultInjectorIsSeededAndProportional(t *testing.T) {
	f := Faults{Seed: 9, Drop: 0.1, Delay: 0.2, Duplicate: 0.3}
	if err := f.normalize(); err != nil {
		t.Fatal(err)
	}
	a, b := newFaultInjector(f), newFaultInjector(f)
	var counts [4]int
	const n = 20000
	for range n {
		x, y := a.decide(), b.decide()
		if x != y {
			t.Fatalf("same seed, different decisions: %v vs %v", x, y)
		}
		counts[x]++
	}
	for act, want := range map[faultAction]float64{faultDrop: 0.1, faultDelay: 0.2, faultDuplicate: 0.3, faultNone: 0.4} {
		got := float64(counts[act]) / n
		if got < want-0.02 || got > want+0.02 {
			t.Errorf("%v: fraction %.3f, want %.2f", act, got, want)
		}
	}
	// Another seed gives another sequence.
	c, d := newFaultInjector(Faults{Seed: 1, Drop: 0.5}), newFaultInjector(Faults{Seed: 2, Drop: 0.5})
	differ := 0
	for range 64 {
		if c.decide() != d.decide() {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("seeds 1 and 2 drew the same 64 decisions")
	}
}

func TestFaultsRejectBadValues(t *testing.T) {
	for _, f := range []Faults{{Drop: -0.1}, {Delay: 1.5}, {Duplicate: 2}, {DelayTime: -time.Second}} {
		if err := f.normalize(); err == nil {
			t.Errorf("%+v accepted", f)
		}
	}
	f := Faults{}
	if err := f.normalize(); err != nil || f.DelayTime != time.Millisecond {
		t.Fatalf("defaults: %+v %v", f, err)
	}
}

func TestFaultInjectorHoldReleasesInOrder(t *testing.T) {
	fi := newFaultInjector(Faults{DelayTime: 10 * time.Millisecond})
	base := time.Unix(100, 0)
	src := []byte("first")
	fi.hold(&txPacket{buf: src, to: netipAddr(t, "127.0.0.1")}, base)
	src[0] = 'X' // the held copy must not follow the device's buffer
	// A zero-copy datagram is held whole: its payload is the sender's.
	payload := []byte("eco")
	fi.hold(&txPacket{buf: []byte("snd"), payload: payload, split: 1, to: netipAddr(t, "127.0.0.2")}, base.Add(5*time.Millisecond))
	payload[0] = 'X'

	if due := fi.nextDue(); !due.Equal(base.Add(10 * time.Millisecond)) {
		t.Fatalf("next due %v", due)
	}
	s := newSender(&udpSocket{port: 1}, 4)
	if n := fi.release(base.Add(9*time.Millisecond), s); n != 0 {
		t.Fatalf("released %d before due", n)
	}
	if n := fi.release(base.Add(12*time.Millisecond), s); n != 1 || string(s.datagram(0)) != "first" {
		t.Fatalf("released %d, staged %q", n, s.datagram(0))
	}
	s.reset()
	fi.recycle(1)
	if len(fi.held) != 1 || string(fi.held[0].buf) != "second" || len(fi.spare) != 1 {
		t.Fatalf("after recycle: held %d spare %d", len(fi.held), len(fi.spare))
	}
	fi.hold(&txPacket{buf: []byte("third"), to: netipAddr(t, "127.0.0.3")}, base)
	if len(fi.spare) != 0 {
		t.Fatal("spare buffer not reused")
	}
}

// udEnd is a UD QP in RTS with receive buffers posted.
type udEnd struct {
	dev *Device
	qp  hca.QP
	cq  *waitCQ
	buf [][]byte
}

const testQKey = 0x0B1B

func newUDEnd(t *testing.T, d *Device, nrecv int) *udEnd {
	t.Helper()
	e := &udEnd{dev: d, cq: newWaitCQ(t, d, 4096)}
	qp, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: e.cq.CQ, RecvCQ: e.cq.CQ, MaxSendWR: 256, MaxRecvWR: nrecv})
	if err != nil {
		t.Fatal(err)
	}
	e.qp = qp
	mustModify(t, qp, hca.QPAttr{State: hca.QPStateInit, QKey: testQKey})
	mustModify(t, qp, hca.QPAttr{State: hca.QPStateRTR})
	mustModify(t, qp, hca.QPAttr{State: hca.QPStateRTS})
	wrs := make([]hca.RecvWR, nrecv)
	for i := range wrs {
		b, _ := d.Alloc(4096)
		e.buf = append(e.buf, b)
		wrs[i] = hca.RecvWR{ID: uint64(i), Buf: b}
	}
	if _, err := qp.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestDelayedDatagramsAreOvertaken sends numbered UD datagrams one post
// (one socket write batch) at a time with half of them delayed: every
// datagram arrives exactly once, and some arrive after datagrams that
// were written in later batches.
func TestDelayedDatagramsAreOvertaken(t *testing.T) {
	f := newTestFabric(t, 33, Faults{Seed: 3, Delay: 0.5, DelayTime: 20 * time.Millisecond})
	a, b := newUDEnd(t, f.newDevice(t), 1), newUDEnd(t, f.newDevice(t), 64)
	ah, err := a.dev.CreateAH(b.dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		msg := binary.BigEndian.AppendUint32(nil, uint32(i))
		if _, err := a.qp.PostSend([]hca.SendWR{{ID: uint64(i), Data: msg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey}}); err != nil {
			t.Fatal(err)
		}
	}
	// The sender's completions share a's CQ; drain them.
	a.cq.wait(t, n)
	seen := make(map[uint32]bool)
	inversions := 0
	last := -1
	for _, wc := range b.cq.wait(t, n) {
		if wc.Status != hca.StatusSuccess || wc.ByteLen != 4 || wc.SrcQPN != a.qp.QPN() {
			t.Fatalf("completion %+v", wc)
		}
		seq := binary.BigEndian.Uint32(b.buf[wc.ID][:4])
		if seen[seq] {
			t.Fatalf("datagram %d twice", seq)
		}
		seen[seq] = true
		if int(seq) < last {
			inversions++
		}
		last = int(seq)
	}
	// Held datagrams leave from the timer goroutine, which Close waits
	// for: after it the sender's counters are final.
	if err := a.dev.Close(); err != nil {
		t.Fatal(err)
	}
	f.devs = f.devs[1:]
	s := a.dev.Stats()
	if len(seen) != n || s.FaultDelayed == 0 || inversions == 0 {
		t.Fatalf("distinct %d of %d, delayed %d, inversions %d", len(seen), n, s.FaultDelayed, inversions)
	}
	if s.TxPackets != n {
		t.Fatalf("tx packets %d, want %d (delayed ones sent once, late)", s.TxPackets, n)
	}
	t.Logf("delayed %d of %d, %d arrived after a later one", s.FaultDelayed, n, inversions)
}

func netipAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestUDLossOnlySparesUD: with UDLossOnly a UD datagram is lost or
// delivered once, in order; the losses are counted in UDDropped.
func TestUDLossOnlySparesUD(t *testing.T) {
	f := newTestFabric(t, 34, Faults{Seed: 5, Drop: 0.2, Duplicate: 0.3, Reorder: 0.3, Delay: 0.3, UDLossOnly: true})
	a, b := newUDEnd(t, f.newDevice(t), 1), newUDEnd(t, f.newDevice(t), 256)
	ah, err := a.dev.CreateAH(b.dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		msg := binary.BigEndian.AppendUint32(nil, uint32(i))
		if _, err := a.qp.PostSend([]hca.SendWR{{ID: uint64(i), Data: msg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey}}); err != nil {
			t.Fatal(err)
		}
	}
	a.cq.wait(t, n)
	// PostSend writes before it returns and nothing is delayed: the
	// sender's counters are final.
	s := a.dev.Stats()
	if s.FaultDropped == 0 || s.UDDropped != s.FaultDropped || s.FaultDuplicated+s.FaultDelayed+s.FaultReordered != 0 {
		t.Fatalf("dropped %d (UD %d), duplicated %d, delayed %d, reordered %d", s.FaultDropped, s.UDDropped,
			s.FaultDuplicated, s.FaultDelayed, s.FaultReordered)
	}
	last := -1
	for _, wc := range b.cq.wait(t, n-int(s.FaultDropped)) {
		seq := int(binary.BigEndian.Uint32(b.buf[wc.ID][:4]))
		if wc.Status != hca.StatusSuccess || seq <= last {
			t.Fatalf("datagram %d after %d: %+v", seq, last, wc)
		}
		last = seq
	}
}
