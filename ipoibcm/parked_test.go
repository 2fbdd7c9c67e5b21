package ipoibcm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// Peers that advertise 'C' but never answer a REQ (their GID has no
// device: the REQ is lost, the CM waits a minute) each park three frames.
// Parked frames may hold only a quarter of the credits; the rest are
// dropped as tx_neigh_queue_full, and a healthy datagram peer keeps
// receiving. Without the cap 50 such peers would park 127 frames, stop
// the reader at the credit limit and starve the healthy peer.
func TestParkedCreditsCappedHealthyPeerFlows(t *testing.T) {
	fab := rvFabric(t, 21)
	pa, pb := rvNewCapture(1), rvNewCapture(2)
	a := rvStart(t, fab, "a", pa, func(c *Config) { c.CM = rvSlowCM() })
	b := rvStart(t, fab, "b", pb, func(c *Config) { c.DisableCM, c.Mode = true, ModeDatagram })

	now := time.Now()
	const dead = 50
	var deadMACs []frame.MAC
	for k := range dead {
		hw := frame.NewHWAddr(frame.FlagRC, hca.QPN(0x100+k), rvFakeGID(k))
		deadMACs = append(deadMACs, rvLearn(a, hw, netip.AddrFrom4([4]byte{10, 0, 1, byte(k)}), now))
	}
	healthy := rvLearn(a, b.HWAddr(), netip.AddrFrom4([4]byte{10, 0, 0, 2}), now)
	src := frame.MAC(pa.mac)

	for k, mac := range deadMACs {
		for range maxParked {
			pa.in <- rvIPv4(mac, src, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 1, byte(k)}, 200)
		}
	}
	const healthyFrames = 20
	for range healthyFrames {
		pa.in <- rvIPv4(healthy, src, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 200)
	}
	// The reader handles frames in order: once the healthy ones arrived,
	// every dead peer's frame was parked or dropped.
	for k := range healthyFrames {
		pb.next(t, 10*time.Second, fmt.Sprintf("healthy frame %d", k), rvIsIPv4)
	}

	capCredits := a.cfg.SendQueueSize / 4
	if got := a.tx.parkedCreditCap(); got != capCredits {
		t.Fatalf("parkedCreditCap %d, want SendQueueSize/4 = %d", got, capCredits)
	}
	st := a.Stats()
	parked := 0
	for _, n := range st.Neighbours {
		parked += n.Parked
	}
	if parked != capCredits {
		t.Fatalf("%d frames parked, want the cap %d", parked, capCredits)
	}
	a.neigh.mu.Lock()
	held := a.tx.parkedCredits
	a.neigh.mu.Unlock()
	if held != capCredits || st.Outstanding < int64(capCredits) {
		t.Fatalf("parked credits %d, outstanding %d; want %d held", held, st.Outstanding, capCredits)
	}
	if got, want := st.Drops["tx_neigh_queue_full"], uint64(dead*maxParked-capCredits); got != want {
		t.Fatalf("tx_neigh_queue_full %d, want %d", got, want)
	}
	if st.Reaper.TXQueueStops != 0 {
		t.Fatalf("reader stopped %d times", st.Reaper.TXQueueStops)
	}
}

// A frame parked for a connection whose path turns out smaller than the
// packet (here the interface's own 9000-byte MTU, below the peer's 65520)
// gets ICMPv6 packet-too-big at REP time, never a silent drop or an
// oversize send.
func TestParkedFrameTooBigGetsPacketTooBig(t *testing.T) {
	fab := rvFabric(t, 22)
	pa, pb := rvNewCapture(1), rvNewCapture(2)
	a := rvStart(t, fab, "a", pa, func(c *Config) { c.MTU = 9000 })
	b := rvStart(t, fab, "b", pb, nil)
	if a.MTU() != 9000 {
		t.Fatalf("MTU %d", a.MTU())
	}
	from, to := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	mac := rvLearn(a, b.HWAddr(), to, time.Now())
	src := frame.MAC(pa.mac)

	// First packet to a new 'C' neighbour: parked until the REP.
	pa.in <- rvIPv6(mac, src, from, to, 10000)
	reply := pa.next(t, 10*time.Second, "ICMPv6 packet-too-big", func(f []byte) bool {
		return len(f) >= frame.EthHdrLen+48 && binary.BigEndian.Uint16(f[12:14]) == frame.EtherTypeIPv6 &&
			f[frame.EthHdrLen+6] == 58 && f[frame.EthHdrLen+40] == 2
	})
	ip := reply[frame.EthHdrLen:]
	if mtu := binary.BigEndian.Uint32(ip[44:48]); mtu != 9000 {
		t.Fatalf("packet-too-big carries MTU %d, want 9000", mtu)
	}
	if got := netip.AddrFrom16([16]byte(ip[8:24])); got != to {
		t.Fatalf("packet-too-big from %s, want the destination %s", got, to)
	}
	if got := frame.MAC(reply[6:12]); got != mac {
		t.Fatalf("packet-too-big from MAC %s, want the neighbour's %s", got, mac)
	}

	// The connection is up: a packet that fits goes through, and it is
	// the only one the peer's host sees.
	pa.in <- rvIPv6(mac, src, from, to, 1000)
	got := pb.next(t, 10*time.Second, "IPv6 packet at the peer", func(f []byte) bool {
		return len(f) > frame.EthHdrLen && binary.BigEndian.Uint16(f[12:14]) == frame.EtherTypeIPv6 && f[frame.EthHdrLen+6] == 17
	})
	if len(got) != frame.EthHdrLen+1000 {
		t.Fatalf("peer received a %d-byte frame first, want the 1000-byte packet", len(got))
	}
	st := a.Stats()
	if st.Drops["tx_too_big"] != 1 || st.Reaper.TooBigSent != 1 {
		t.Fatalf("tx_too_big %d, too_big_sent %d; want 1 and 1", st.Drops["tx_too_big"], st.Reaper.TooBigSent)
	}
	if st.Drops["tx_post_failed"] != 0 {
		t.Fatalf("tx_post_failed %d", st.Drops["tx_post_failed"])
	}
}
