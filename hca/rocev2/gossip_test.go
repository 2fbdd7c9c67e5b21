package rocev2

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// gossipFabric is loopback devices with Config.Gossip.
type gossipFabric struct {
	port uint16
	devs []*Device
}

func newGossipFabric(t *testing.T) *gossipFabric {
	g := &gossipFabric{port: borrowPort4(t, netip.MustParseAddr("127.34.0.1"))}
	t.Cleanup(func() {
		for _, d := range g.devs {
			if err := d.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return g
}

func borrowPort4(t *testing.T, a netip.Addr) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
}

func (g *gossipFabric) open(t *testing.T, host byte, peers ...byte) *Device {
	t.Helper()
	cfg := Config{Bind: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 34, 0, host}), g.port), Gossip: true, Name: t.Name()}
	for _, p := range peers {
		cfg.Peers = append(cfg.Peers, netip.AddrFrom4([4]byte{127, 34, 0, p}))
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.devs = append(g.devs, d)
	return d
}

// waitFor blocks until cond holds.
func (g *gossipFabric) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitUntil(t, cond, func() string { return "waiting for " + what })
}

func sameMembers(d *Device, want []netip.Addr) bool {
	m := d.Members()
	slices.SortFunc(m, netip.Addr.Compare)
	return slices.Equal(m, want)
}

// A device that knows one seed comes to know every member and every
// member it: hosts 2 and 3 know only host 1, host 4 joins later knowing
// only host 2, and every table ends up holding all four.
func TestGossipConverges(t *testing.T) {
	g := newGossipFabric(t)
	g.open(t, 1)
	g.open(t, 2, 1)
	g.open(t, 3, 1)
	var all []netip.Addr
	for h := range 4 {
		all = append(all, netip.AddrFrom4([4]byte{127, 34, 0, byte(h + 1)}))
	}
	g.waitFor(t, "hosts 1-3 to know each other", func() bool {
		for _, d := range g.devs {
			if !sameMembers(d, all[:3]) {
				return false
			}
		}
		return true
	})
	late := g.open(t, 4, 2)
	g.waitFor(t, "every host to know all four", func() bool {
		for _, d := range g.devs {
			if !sameMembers(d, all) {
				return false
			}
		}
		return true
	})
	if s := late.Stats(); s.GossipLearned < 2 || s.GossipDropped != 0 {
		t.Fatalf("late joiner: learned %d, dropped %d", s.GossipLearned, s.GossipDropped)
	}
}

// memberPacket is a membership MAD from src to dst as a RoCEv2 datagram
// with a valid ICRC.
func memberPacket(t *testing.T, src, dst netip.AddrPort, m *wire.MemberMAD) []byte {
	t.Helper()
	mad := make([]byte, wire.MemberMADLen)
	wire.PutMemberMAD(mad, m)
	s := wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xFFFF, DestQP: 1},
		DETH: wire.DETH{QKey: uint32(hca.QKeyGSI), SrcQP: 1}, Payload: mad}
	frame, err := wire.AppendFrame(nil, src, dst, wire.AppendPacket(nil, &s), false)
	if err != nil {
		t.Fatal(err)
	}
	return frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:]
}

// An unverified source gets one answer of the same size per request,
// never more, and cannot feed a list it was not asked for.
func TestGossipNoAmplification(t *testing.T) {
	g := newGossipFabric(t)
	d := g.open(t, 1)
	for h := range 60 { // more members than one answer carries
		d.AddPeer(netip.AddrFrom4([4]byte{127, 34, 1, byte(h)}))
	}
	src := netip.AddrPortFrom(netip.MustParseAddr("127.34.0.200"), g.port)
	c := listenDF(t, src)
	defer c.Close()
	const n = 20
	for k := range n {
		pkt := memberPacket(t, src, d.LocalAddr(), &wire.MemberMAD{Method: wire.MemberGet, TID: uint64(1000 + k)})
		if _, err := c.WriteToUDPAddrPort(pkt, d.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	// Unsolicited: a list nobody asked for.
	forged := memberPacket(t, src, d.LocalAddr(), &wire.MemberMAD{Method: wire.MemberGetResp, TID: 7, Total: 1,
		Addrs: []netip.Addr{netip.MustParseAddr("127.34.2.1")}})
	if _, err := c.WriteToUDPAddrPort(forged, d.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	answers := 0
	buf := make([]byte, 2048)
	m := wire.MemberMAD{Addrs: make([]netip.Addr, 0, wire.MaxMemberAddrs(false))}
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for answers < n {
		k, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("after %d answers: %v", answers, err)
		}
		var p wire.Packet
		if err := wire.ParsePacket(buf[:k], &p); err != nil || wire.ParseMemberMAD(p.Payload, &m) != nil {
			t.Fatalf("not a membership MAD: % x", buf[:k])
		}
		if m.Method != wire.MemberGetResp {
			continue // the device's own anti-entropy Get: its choice, not an answer
		}
		if k != len(forged) || m.TID < 1000 || m.TID >= 1000+n || m.Total != 62 || len(m.Addrs) != wire.MaxMemberAddrs(false) {
			t.Fatalf("answer %d: %d bytes (request %d), %+v", answers, k, len(forged), m)
		}
		answers++
	}
	g.waitFor(t, "the forged list to be dropped", func() bool { return d.Stats().GossipDropped == 1 })
	if s := d.Stats(); s.GossipReplies != n || s.GossipLearned != 0 || slices.Contains(d.Members(), netip.MustParseAddr("127.34.2.1")) {
		t.Fatalf("replies %d learned %d members %v", s.GossipReplies, s.GossipLearned, d.Members())
	}
}
