package rocev2

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// icrcPacket builds an RC SEND packet of n payload bytes from src to dst
// with its ICRC for IPv4 ID 0, as queuePacket does.
func icrcPacket(t *testing.T, src, dst netip.AddrPort, psn uint32, n int) []byte {
	t.Helper()
	spec := wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCSendMiddle, PKey: 0xFFFF, DestQP: 0x11, PSN: psn}, Payload: make([]byte, n)}
	pkt := wire.AppendPacket(nil, &spec)
	var hdr [wire.IPv4HeaderLen + wire.UDPHeaderLen]byte
	wire.PutIPv4Header(hdr[:], src.Addr(), dst.Addr(), wire.UDPHeaderLen+len(pkt))
	wire.PutUDPHeader(hdr[wire.IPv4HeaderLen:], src.Port(), dst.Port(), wire.UDPHeaderLen+len(pkt))
	if err := wire.PutICRC(hdr[:wire.IPv4HeaderLen], hdr[wire.IPv4HeaderLen:], pkt); err != nil {
		t.Fatal(err)
	}
	return pkt
}

// checkID verifies pkt's ICRC as a receiver does and returns the IPv4 ID
// it was computed for.
func checkID(t *testing.T, src, dst netip.AddrPort, pkt []byte, c *wire.IDShiftCache) uint16 {
	t.Helper()
	var hdr [wire.IPv4HeaderLen + wire.UDPHeaderLen]byte
	wire.PutIPv4Header(hdr[:], src.Addr(), dst.Addr(), wire.UDPHeaderLen+len(pkt))
	wire.PutUDPHeader(hdr[wire.IPv4HeaderLen:], src.Port(), dst.Port(), wire.UDPHeaderLen+len(pkt))
	id, err := wire.CheckICRCGSO(hdr[:wire.IPv4HeaderLen], hdr[wire.IPv4HeaderLen:], pkt, c)
	if err != nil {
		t.Fatalf("ICRC of %d-byte packet: %v", len(pkt), err)
	}
	return id
}

// TestSenderSplitsMessagesBySocket: datagrams of different QPs leave from
// different sockets (their UDP source ports), so a GSO message never
// mixes them, and each message remembers its socket.
func TestSenderSplitsMessagesBySocket(t *testing.T) {
	main := &udpSocket{port: 4791, gso: true}
	q1, q2 := &udpSocket{port: 0xC123, gso: true}, &udpSocket{port: 0xD456, gso: true}
	src := netip.MustParseAddrPort("10.0.0.1:4791")
	a := netip.MustParseAddrPort("10.0.0.2:4791")
	w := newSender(main, 16)
	w.gso = true
	for i, s := range []*udpSocket{q1, q1, q2, q2, q2, nil, q1} {
		if !w.stage(icrcPacket(t, src, a, uint32(i), 1024), a.Addr(), s) {
			t.Fatal("stage refused")
		}
	}
	w.build()
	wantSrc := []*udpSocket{q1, q2, main, q1}
	wantFirst := []int{0, 2, 5, 6, 7}
	if w.msgs != len(wantSrc) {
		t.Fatalf("%d messages, want %d", w.msgs, len(wantSrc))
	}
	for m := range wantSrc {
		if w.msgSrc[m] != wantSrc[m] || w.msgFirst[m] != wantFirst[m] {
			t.Fatalf("message %d: socket port %d first %d, want %d, %d", m, w.msgSrc[m].port, w.msgFirst[m], wantSrc[m].port, wantFirst[m])
		}
	}
	w.reset()
}

func TestSenderGroupsRunsAndStampsIDs(t *testing.T) {
	const port = 4791
	src := netip.MustParseAddrPort("10.0.0.1:4791")
	a, b := netip.MustParseAddrPort("10.0.0.2:4791"), netip.MustParseAddrPort("10.0.0.3:4791")
	w := newSender(&udpSocket{port: port, gso: true}, 64)
	w.gso = true
	// 15 full segments to a (the 16th would pass 64 KiB), a short tail,
	// a lone packet to b, three equal ones to a, one larger to a.
	type dg struct {
		to netip.AddrPort
		n  int
	}
	var plan []dg
	for range 16 {
		plan = append(plan, dg{a, 4096})
	}
	plan = append(plan, dg{a, 100}, dg{b, 4096}, dg{a, 20}, dg{a, 20}, dg{a, 20}, dg{a, 40})
	for i, d := range plan {
		pkt := icrcPacket(t, src, d.to, uint32(i), d.n)
		if i%3 == 0 && d.n >= 1000 {
			// Zero-copy: headers and tail in one buffer, the payload
			// elsewhere; the sender gathers them and stamps the tail.
			const h = wire.BTHLen
			p := txPacket{buf: append(append([]byte(nil), pkt[:h]...), pkt[h+d.n:]...), payload: pkt[h : h+d.n], split: h, to: d.to.Addr()}
			if !w.stagePacket(&p) {
				t.Fatal("stage refused")
			}
			continue
		}
		if !w.stage(pkt, d.to.Addr(), nil) {
			t.Fatal("stage refused")
		}
	}
	w.build()
	wantRuns := []int{15, 2, 1, 3, 1} // 4096 x15 | 4096+100 | b | 20 x3 | 40
	if w.msgs != len(wantRuns) {
		t.Fatalf("%d messages, want %d: %v", w.msgs, len(wantRuns), w.msgFirst[:w.msgs+1])
	}
	var cache wire.IDShiftCache
	for m, want := range wantRuns {
		lo, hi := w.msgFirst[m], w.msgFirst[m+1]
		if hi-lo != want {
			t.Fatalf("message %d carries %d datagrams, want %d", m, hi-lo, want)
		}
		h := &w.batch.hdrs[m].Hdr
		if int(h.Iovlen) != w.iovFirst[hi]-w.iovFirst[lo] || h.Iov != &w.iovs[w.iovFirst[lo]] {
			t.Fatalf("message %d iovecs %d", m, h.Iovlen)
		}
		if want == 1 {
			if h.Controllen != 0 {
				t.Fatalf("single datagram %d has a control message", m)
			}
		} else {
			c := w.batch.control(m)
			ch := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			seg := *(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)]))
			if ch.Level != unix.SOL_UDP || ch.Type != unix.UDP_SEGMENT || int(seg) != w.lens[lo] {
				t.Fatalf("message %d control: level %d type %d segment %d", m, ch.Level, ch.Type, seg)
			}
		}
		to := plan[lo].to
		for j := lo; j < hi; j++ {
			if id := checkID(t, src, to, w.datagram(j), &cache); int(id) != j-lo {
				t.Fatalf("datagram %d (segment %d of message %d) has ICRC for ID %d", j, j-lo, m, id)
			}
		}
	}
	w.reset()
	if w.pending != 0 || w.iovs[0].Base != nil || w.icrcs[0] != nil || w.dsts[0].IsValid() {
		t.Fatal("reset left staged state")
	}
	// Without GSO every datagram is its own message, ICRC untouched.
	w.gso = false
	for i := range 3 {
		w.stage(icrcPacket(t, src, a, uint32(i), 4096), a.Addr(), nil)
	}
	w.build()
	if w.msgs != 3 || checkID(t, src, a, w.datagram(2), &cache) != 0 {
		t.Fatalf("plain build: %d messages", w.msgs)
	}
}

func TestGROSegmentSize(t *testing.T) {
	ctrl := make([]byte, cmsgSpace)
	ch := (*unix.Cmsghdr)(unsafe.Pointer(&ctrl[0]))
	ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_GRO
	ch.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(ctrl[unix.CmsgLen(0):], 4112)
	if got := groSegmentSize(ctrl); got != 4112 {
		t.Fatalf("segment size %d, want 4112", got)
	}
	ch.Type = unix.UDP_SEGMENT
	if got := groSegmentSize(ctrl); got != 0 {
		t.Fatalf("other control message read as GRO: %d", got)
	}
	ch.Type = unix.UDP_GRO
	ch.SetLen(uint64ToCmsgLen(1 << 40))
	if got := groSegmentSize(ctrl); got != 0 {
		t.Fatalf("oversized length accepted: %d", got)
	}
	if groSegmentSize(nil) != 0 || groSegmentSize(ctrl[:5]) != 0 {
		t.Fatal("short buffer accepted")
	}
}

// uint64ToCmsgLen gives an oversized cmsg length of the platform's width.
func uint64ToCmsgLen(v uint64) int {
	if unsafe.Sizeof(unix.Cmsghdr{}.Len) == 8 {
		return int(v)
	}
	return 1 << 30
}

func FuzzGROSegmentSize(f *testing.F) {
	ctrl := make([]byte, cmsgSpace)
	ch := (*unix.Cmsghdr)(unsafe.Pointer(&ctrl[0]))
	ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_GRO
	ch.SetLen(unix.CmsgLen(4))
	f.Add(ctrl)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := groSegmentSize(b); n < 0 || n > 1<<31 {
			t.Fatalf("segment size %d", n)
		}
	})
}

// offloadPair connects two RC ends on devices of one fabric with the
// given offload switches.
func offloadPair(t *testing.T, netID byte, disable bool) (*testFabric, *rcEnd, *rcEnd) {
	t.Helper()
	f := newTestFabric(t, netID, Faults{})
	open := func() *Device {
		cfg := f.config(t)
		cfg.DisableGSO, cfg.DisableGRO = disable, disable
		return f.open(t, cfg)
	}
	a, b := newRCEnd(t, open(), rcOpts{}), newRCEnd(t, open(), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	return f, a, b
}

func TestGSOAndGROCarryRCMessages(t *testing.T) {
	_, a, b := offloadPair(t, 50, false)
	if !a.dev.sock.gso || !b.dev.sock.gro {
		t.Skip("kernel lacks UDP_SEGMENT or UDP_GRO (Linux 4.18 / 5.0)")
	}
	sizes := []int{65520, 65524, 65536, 4097, 1, 65520, 12289, 65520}
	sendAndCheck(t, a, b, sizes)
	sendAndCheck(t, b, a, []int{65520, 100})
	sa, sb := a.dev.Stats(), b.dev.Stats()
	if sa.TxGSOMessages == 0 || sb.RxGROMessages == 0 {
		t.Fatalf("offloads unused: sender %d GSO messages, receiver %d GRO messages", sa.TxGSOMessages, sb.RxGROMessages)
	}
	if sa.TotalDropped()+sb.TotalDropped() != 0 || sa.Retransmits != 0 || sa.TxErrors != 0 {
		t.Fatalf("drops or retransmits: a %+v b %+v", sa, sb)
	}
	// Every datagram is counted once on each side, coalesced or not. A
	// sender counts after its sendmsg returns, which may be after the
	// receiver counted the packet, so the sides are compared once they
	// settle (bounded: there is no event for a counter update).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		sa, sb = a.dev.Stats(), b.dev.Stats()
		if sa.TxPackets == sb.RxPackets && sb.TxPackets == sa.RxPackets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("packets a->b %d/%d, b->a %d/%d", sa.TxPackets, sb.RxPackets, sb.TxPackets, sa.RxPackets)
		}
	}
}

func TestOffloadsCanBeDisabled(t *testing.T) {
	_, a, b := offloadPair(t, 51, true)
	if a.dev.sock.gso || a.dev.sock.gro || a.dev.tx.gso {
		t.Fatal("offloads on despite DisableGSO/DisableGRO")
	}
	sendAndCheck(t, a, b, []int{65520, 65520})
	if s := a.dev.Stats(); s.TxGSOMessages != 0 || s.TxPackets < 32 || b.dev.Stats().RxGROMessages != 0 {
		t.Fatalf("plain path used offloads: %+v", s)
	}
}

func TestFaultsTurnGSOOff(t *testing.T) {
	f := newTestFabric(t, 52, Faults{Drop: 0.01, Seed: 1})
	if d := f.newDevice(t); d.tx.gso {
		t.Fatal("GSO on while faults are injected")
	}
}

// TestGSOSendToPlainSocket sends one IPoIB-sized message to a plain UDP
// socket without GRO, so the kernel cuts the super-packet (as for a peer
// that never asked for GRO): 16 datagrams of the right sizes arrive, and
// each one's ICRC is the one for its index in the run, the ID Linux's
// inet_gso_segment gives it.
func TestGSOSendToPlainSocket(t *testing.T) {
	f := newTestFabric(t, 53, Faults{})
	d := f.newDevice(t)
	if !d.sock.gso {
		t.Skip("kernel lacks UDP_SEGMENT (Linux 4.18)")
	}
	peer := netip.AddrPortFrom(netip.MustParseAddr("127.53.0.200"), f.port)
	plain, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(peer))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	e := newRCEnd(t, d, rcOpts{})
	mustModify(t, e.qp, hca.QPAttr{State: hca.QPStateInit})
	mustModify(t, e.qp, hca.QPAttr{State: hca.QPStateRTR, DestQPN: 0x99, DestGID: hca.GIDFromAddr(peer.Addr()), PathMTU: hca.MTU4096})
	mustModify(t, e.qp, hca.QPAttr{State: hca.QPStateRTS, SQPSN: 1})
	msg := make([]byte, 65520) // 16 packets: a run of 15 and a tail
	fill(msg, 3)
	if _, err := e.qp.PostSend([]hca.SendWR{{ID: 1, Data: msg}}); err != nil {
		t.Fatal(err)
	}
	if err := plain.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var cache wire.IDShiftCache
	buf := make([]byte, 1<<16)
	wantIDs := []uint16{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0}
	for i, want := range wantIDs {
		n, from, err := plain.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if n > d.maxPacket {
			t.Fatalf("datagram %d is %d bytes: the kernel did not segment", i, n)
		}
		if id := checkID(t, from, peer, buf[:n], &cache); id != want {
			t.Fatalf("datagram %d carries the ICRC of IPv4 ID %d, want %d", i, id, want)
		}
	}
	if s := d.Stats(); s.TxGSOMessages != 1 || s.TxPackets != 16 {
		t.Fatalf("sender: %d GSO messages, %d packets", s.TxGSOMessages, s.TxPackets)
	}
}

// datagram gathers staged datagram i's iovecs: the bytes the kernel
// would send.
func (w *sender) datagram(i int) []byte {
	var b []byte
	for _, v := range w.iovs[w.iovFirst[i]:w.iovFirst[i+1]] {
		b = append(b, unsafe.Slice(v.Base, v.Len)...)
	}
	return b
}

// TestAuxNetOffset: the packet socket's PACKET_AUXDATA is found behind
// another control message and read without allocating; its absence is -1.
func TestAuxNetOffset(t *testing.T) {
	gro := unix.CmsgSpace(4)
	ctrl := make([]byte, gro+auxSpace)
	ch := (*unix.Cmsghdr)(unsafe.Pointer(&ctrl[0]))
	ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_GRO
	ch.SetLen(unix.CmsgLen(4))
	aux := (*unix.Cmsghdr)(unsafe.Pointer(&ctrl[gro]))
	aux.Level, aux.Type = unix.SOL_PACKET, unix.PACKET_AUXDATA
	aux.SetLen(unix.CmsgLen(sizeofAuxdata))
	(*unix.TpacketAuxdata)(unsafe.Pointer(&ctrl[gro+unix.CmsgLen(0)])).Net = 14
	if got := auxNetOffset(ctrl); got != 14 {
		t.Fatalf("tp_net %d, want 14", got)
	}
	if a := testing.AllocsPerRun(100, func() { auxNetOffset(ctrl) }); a != 0 {
		t.Fatalf("%v allocations per call", a)
	}
	if got := auxNetOffset(ctrl[:gro]); got != -1 {
		t.Fatalf("without auxdata: %d, want -1", got)
	}
	aux.SetLen(unix.CmsgLen(2))
	if got := auxNetOffset(ctrl); got != -1 {
		t.Fatalf("short auxdata read: %d", got)
	}
}
