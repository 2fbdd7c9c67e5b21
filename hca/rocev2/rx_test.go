package rocev2

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// sendRaw sends one datagram to d from a socket on srcAddr bound to d's
// port, so the device treats it as a fabric peer.
func sendRaw(t *testing.T, from netip.AddrPort, to netip.AddrPort, b []byte) {
	t.Helper()
	c := listenDF(t, from)
	defer c.Close()
	if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
		t.Fatal(err)
	}
}

// TestGarbageCountedWhileTrafficFlows throws malformed datagrams of every
// kind at a device between RC messages; each is counted under its reason
// and the connection keeps working.
func TestGarbageCountedWhileTrafficFlows(t *testing.T) {
	f := newTestFabric(t, 30, Faults{})
	a, b := newRCEnd(t, f.newDevice(t), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	sendAndCheck(t, a, b, []int{10, 5000})

	evil := netip.AddrPortFrom(netip.MustParseAddr("127.30.0.200"), f.port)
	to := b.dev.LocalAddr()
	valid := func(mod func(*wire.PacketSpec)) []byte {
		s := wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xFFFF, DestQP: 1},
			DETH: wire.DETH{QKey: uint32(hca.QKeyGSI), SrcQP: 1}, Payload: []byte("mad")}
		if mod != nil {
			mod(&s)
		}
		pkt := wire.AppendPacket(nil, &s)
		frame, err := wire.AppendFrame(nil, evil, to, pkt, false)
		if err != nil {
			t.Fatal(err)
		}
		return frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:]
	}
	badICRC := valid(nil)
	badICRC[len(badICRC)-1] ^= 1
	tver := valid(nil)
	tver[1] |= 1
	cases := []struct {
		pkt  []byte
		want wire.DropReason
	}{
		{[]byte("hello"), wire.DropGarbage},
		{valid(nil)[:18], wire.DropTruncated}, // BTH and ICRC fit, the DETH does not
		{tver, wire.DropBadTVer},
		{badICRC, wire.DropBadICRC},
		{valid(func(s *wire.PacketSpec) { s.BTH.PKey = 0x1234 }), wire.DropBadPKey},
		{valid(func(s *wire.PacketSpec) { s.BTH.DestQP = 0x4242 }), wire.DropUnknownQP},
		{valid(func(s *wire.PacketSpec) { s.BTH.Opcode = 0x0a }), wire.DropBadOpcode},
		{valid(func(s *wire.PacketSpec) { s.BTH.Opcode = wire.OpRCSendOnly; s.BTH.DestQP = uint32(b.qp.QPN()) }), wire.DropWrongState},
		{make([]byte, 6000), wire.DropTruncated},
	}
	for i, c := range cases {
		before := b.dev.Stats().Dropped(c.want)
		sendRaw(t, evil, to, c.pkt)
		f.waitRx(t, b.dev, func(s Stats) bool { return s.Dropped(c.want) > before })
		if s := b.dev.Stats(); s.Dropped(c.want) != before+1 {
			t.Fatalf("case %d: %v count %d, want %d", i, c.want, s.Dropped(c.want), before+1)
		}
	}
	sendAndCheck(t, a, b, []int{65524, 1})
	if n := a.dev.Stats().TotalDropped(); n != 0 {
		t.Fatalf("sender dropped %d", n)
	}
}

// FuzzReceive feeds arbitrary datagrams to a live device's receive path.
// The second argument's bits choose: 1, a valid ICRC on the socket's path;
// 2, one flipped ICRC bit on the packet socket's path; 4, the BTH aimed at
// the live RC QP (its destination QP replaced by the QP's number, which
// the device draws from a random point, so no fixed number in a seed
// reaches it).
func FuzzReceive(f *testing.F) {
	const toQP, validICRC = 4, 1
	f.Add([]byte{}, uint32(0))
	f.Add(wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCAck, PKey: 0xFFFF},
		AETH: wire.AETH{Syndrome: wire.SyndromeNAKSeqErr}}), uint32(toQP|validICRC))
	f.Add(wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCSendFirst, PKey: 0xFFFF},
		Payload: make([]byte, 64)}), uint32(toQP|validICRC))
	f.Add(wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCSendFirst, PKey: 0xFFFF},
		Payload: make([]byte, 64)}), uint32(toQP))
	f.Fuzz(func(t *testing.T, b []byte, qpn uint32) {
		// A random 127/8 network per input keeps parallel fuzz workers
		// apart.
		fab := newTestFabric(t, byte(100+rand.IntN(150)), Faults{})
		d := fab.newDevice(t)
		e := newRCEnd(t, d, rcOpts{})
		mustModify(t, e.qp, hca.QPAttr{State: hca.QPStateInit})
		mustModify(t, e.qp, hca.QPAttr{State: hca.QPStateRTR, DestQPN: 0x10, DestGID: hca.GIDFromAddr(netip.AddrFrom4([4]byte{127, fab.net, 0, 9})), PathMTU: 1024})
		mustModify(t, e.qp, hca.QPAttr{State: hca.QPStateRTS, Timeout: 1, RetryCount: 7})
		if qpn&toQP != 0 && len(b) >= wire.BTHLen {
			b = bytes.Clone(b)
			q := uint32(e.qp.QPN())
			b[5], b[6], b[7] = byte(q>>16), byte(q>>8), byte(q)
		}
		buf := make([]byte, 100)
		_, _ = e.qp.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}})
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, fab.net, 0, 9}), d.LocalAddr().Port())
		// Give the packet a valid ICRC half the time so the QP logic runs.
		pkt := bytes.Clone(b)
		if len(pkt) >= wire.BTHLen+wire.ICRCLen && qpn&validICRC != 0 {
			frame, err := wire.AppendFrame(nil, from, d.LocalAddr(), pkt, false)
			if err == nil {
				pkt = frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:]
			}
		}
		var p wire.Packet
		d.mu.Lock()
		d.receive(pkt, from, &p)
		d.unlock()
		// The same bytes through the packet socket's path, behind the IP
		// and UDP headers they would have on the wire (a valid ICRC for
		// those, but for one bit half the time).
		if frame, err := wire.AppendFrame(nil, from, d.LocalAddr(), b, false); err == nil {
			if qpn&2 == 2 {
				frame[len(frame)-1] ^= 0x10
			}
			var f packetFrame
			if parsePacketFrame(rxFrame(frame, 0), 14, &f) == nil {
				var hdr [68]byte
				d.mu.Lock()
				d.receiveFrame(&f, hdr[:], &p)
				d.unlock()
			}
		}
	})
}

// deviceLoops counts the receive and timer loops of every live Device by
// their stack frames: a plain goroutine count also sees the previous
// test's goroutines still exiting, which made this test flaky.
func deviceLoops() (int, string) {
	buf := make([]byte, 1<<20)
	s := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(s, "rocev2.(*Device).rxLoop(") +
		strings.Count(s, "rocev2.(*Device).timerLoop("), s
}

func TestCloseStopsGoroutines(t *testing.T) {
	f := newTestFabric(t, 32, Faults{})
	d := f.newDevice(t)
	// The loops start asynchronously: poll for them as for their end.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if n, _ := deviceLoops(); n >= 2 {
			break
		}
	}
	if n, stacks := deviceLoops(); n < 2 {
		t.Fatalf("%d device loops running, want rx and timer\n%s", n, stacks)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	f.devs = nil
	if err := d.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
	// Close waited for both loops; their exit after wg.Done is all that
	// may remain. A goroutine's exit has no event to wait on, so the
	// loops are polled, with a short sleep so a loaded machine's other
	// work (and the exiting goroutines) get the CPU, until a deadline.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if n, _ := deviceLoops(); n == 0 {
			break
		}
	}
	if n, stacks := deviceLoops(); n != 0 {
		t.Fatalf("%d device loops after Close\n%s", n, stacks)
	}
	if _, err := d.CreateCQ(hca.CQConfig{Size: 1}); err == nil {
		t.Fatal("CreateCQ after Close succeeded")
	}
}
