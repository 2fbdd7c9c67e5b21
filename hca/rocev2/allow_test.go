package rocev2

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// validGSIPacket is a well-formed UD packet to QP1 from src with a valid
// ICRC: everything a receiver would take, so only the allow list can
// stop it.
func validGSIPacket(t *testing.T, src, dst netip.AddrPort) []byte {
	t.Helper()
	s := wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xFFFF, DestQP: 1},
		DETH: wire.DETH{QKey: uint32(hca.QKeyGSI), SrcQP: 1}, Payload: make([]byte, 256)}
	frame, err := wire.AppendFrame(nil, src, dst, wire.AppendPacket(nil, &s), false)
	if err != nil {
		t.Fatal(err)
	}
	return frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:]
}

// A source outside Config.Allow is dropped and counted before parsing:
// even a valid packet neither reaches a QP nor makes its sender a
// broadcast member, while an allowed peer keeps working.
func TestAllowListDropsOtherSources(t *testing.T) {
	f := newTestFabric(t, 31, Faults{})
	a := newRCEnd(t, f.newDevice(t), rcOpts{})
	cfg := f.config(t)
	cfg.Allow = []netip.Prefix{netip.PrefixFrom(a.dev.LocalAddr().Addr(), 32)}
	b := newRCEnd(t, f.open(t, cfg), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})

	evil := netip.AddrPortFrom(netip.MustParseAddr("127.31.0.200"), f.port)
	to := b.dev.LocalAddr()
	before := b.dev.Stats()
	const n = 5
	for range n {
		sendRaw(t, evil, to, validGSIPacket(t, evil, to))
	}
	sendRaw(t, evil, to, []byte("not even a packet"))
	f.waitRx(t, b.dev, func(s Stats) bool { return s.Dropped(wire.DropNotAllowed) == n+1 })
	s := b.dev.Stats()
	if s.TotalDropped()-before.TotalDropped() != n+1 || s.Dropped(wire.DropGarbage) != before.Dropped(wire.DropGarbage) {
		t.Fatalf("drops %v, before %v", s.Drops, before.Drops)
	}
	if slices.Contains(b.dev.Members(), evil.Addr()) {
		t.Fatalf("a source outside the allow list joined the broadcast group: %v", b.dev.Members())
	}
	sendAndCheck(t, a, b, []int{10, 5000})
}

// Hosts heard from join the broadcast group only up to MaxMembers; the
// rest are counted, not added.
func TestMembersBounded(t *testing.T) {
	f := newTestFabric(t, 32, Faults{})
	cfg := f.config(t)
	cfg.MaxMembers = 2 // self and one
	d := f.open(t, cfg)
	to := d.LocalAddr()
	for k := range 3 {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 32, 0, byte(100 + k)}), f.port)
		sendRaw(t, src, to, validGSIPacket(t, src, to))
	}
	f.waitRx(t, d, func(s Stats) bool { return s.RxPackets == 3 })
	if m, s := d.Members(), d.Stats(); len(m) != 2 || s.MemberRefused != 2 {
		t.Fatalf("members %v, refused %d", m, s.MemberRefused)
	}
}

// Datagrams the kernel drops because the device fell behind are counted
// (socket_drops), so the device's counters account for every datagram
// sent to it.
func TestSocketDropsCounted(t *testing.T) {
	f := newTestFabric(t, 33, Faults{})
	d := f.newDevice(t)
	to := d.LocalAddr()
	src := netip.AddrPortFrom(netip.MustParseAddr("127.33.0.100"), f.port)
	c := listenDF(t, src)
	defer c.Close()
	pkt := validGSIPacket(t, src, to)
	// Holding the device lock stalls the receive loop after at most one
	// batch, so the socket buffer (8 MiB) overflows.
	const n = 40000
	d.mu.Lock()
	for range n {
		if _, err := c.WriteToUDPAddrPort(pkt, to); err != nil {
			d.mu.Unlock()
			t.Fatal(err)
		}
	}
	d.mu.Unlock()
	f.waitRx(t, d, func(s Stats) bool { return s.RxPackets+s.SocketDrops == n })
	s := d.Stats()
	if s.SocketDrops == 0 {
		t.Fatalf("no socket drops with the receive loop stalled for %d datagrams: %+v", n, s)
	}
	t.Logf("%d datagrams: %d read, %d dropped by the kernel", n, s.RxPackets, s.SocketDrops)
}

// SetAllow takes effect on the next datagram: a source dropped by the
// list at creation is admitted once the list names it, and dropped again
// once it no longer does; an invalid prefix leaves the list as it was.
func TestSetAllowLive(t *testing.T) {
	f := newTestFabric(t, 33, Faults{})
	b := f.newDevice(t)
	other := netip.AddrPortFrom(netip.MustParseAddr("127.33.0.200"), f.port)
	to := b.LocalAddr()
	if err := b.SetAllow([]netip.Prefix{netip.MustParsePrefix("127.33.0.99/32")}); err != nil {
		t.Fatal(err)
	}
	sendRaw(t, other, to, validGSIPacket(t, other, to))
	f.waitRx(t, b, func(s Stats) bool { return s.Dropped(wire.DropNotAllowed) == 1 })
	if err := b.SetAllow([]netip.Prefix{netip.MustParsePrefix("::ffff:127.33.0.0/120")}); err != nil {
		t.Fatal(err)
	}
	if got := b.Allow(); len(got) != 1 || got[0] != netip.MustParsePrefix("127.33.0.0/24") {
		t.Fatalf("Allow() = %v, want the mapped prefix unmapped", got)
	}
	sendRaw(t, other, to, validGSIPacket(t, other, to))
	f.waitRx(t, b, func(s Stats) bool { return slices.Contains(b.Members(), other.Addr()) })
	if err := b.SetAllow([]netip.Prefix{{}}); err == nil {
		t.Fatal("an invalid prefix was accepted")
	}
	if err := b.SetAllow([]netip.Prefix{netip.MustParsePrefix("127.33.0.99/32")}); err != nil {
		t.Fatal(err)
	}
	sendRaw(t, other, to, validGSIPacket(t, other, to))
	f.waitRx(t, b, func(s Stats) bool { return s.Dropped(wire.DropNotAllowed) == 2 })
}
