package ipoibcm

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// A host re-probing a stale ARP entry sends a unicast request to the MAC
// it knew. Once that neighbour was evicted the MAC means nothing, so the
// request goes to the broadcast group: the peer hears it at once, instead
// of the host blackholing until it gives up on unicast probes.
func TestUnicastARPProbeToEvictedNeighbourIsBroadcast(t *testing.T) {
	fab := rvFabric(t, 61)
	pa, pb := rvNewCapture(1), rvNewCapture(2)
	a := rvStart(t, fab, "a", pa, nil)
	b := rvStart(t, fab, "b", pb, nil)
	aIP, bIP := netip.AddrFrom4([4]byte{10, 0, 0, 1}), netip.AddrFrom4([4]byte{10, 0, 0, 2})

	now := time.Now()
	bMAC := rvLearn(a, b.HWAddr(), bIP, now)
	later := now.Add(a.cfg.NeighbourEvictAfter + time.Second)
	rvOnControlLoop(t, a, func() { a.neigh.age(later, &a.active, &a.passive); a.mcast.age(later) })
	if a.Stats().Reaper.NeighEvicted != 1 {
		t.Fatalf("b not evicted: %+v", a.Stats().Reaper)
	}

	probe := make([]byte, frame.EthHdrLen+frame.EthARPLen)
	frame.PutEthernet(probe, frame.EthHeader{Dst: bMAC, Src: frame.MAC(pa.mac), EtherType: frame.EtherTypeARP})
	req := frame.EthARP{ARP: frame.ARP{Op: frame.ARPRequest, SenderIP: aIP, TargetIP: bIP}, SenderMAC: frame.MAC(pa.mac), TargetMAC: bMAC}
	req.Marshal(probe[frame.EthHdrLen:])
	before := a.Drop("tx_unknown_neighbour")
	pa.in <- probe

	isRequestForB := func(f []byte) bool {
		if len(f) < frame.EthHdrLen+frame.EthARPLen || binary.BigEndian.Uint16(f[12:14]) != frame.EtherTypeARP {
			return false
		}
		got, err := frame.ParseEthARP(f[frame.EthHdrLen:])
		return err == nil && got.Op == frame.ARPRequest && got.TargetIP == bIP && got.SenderIP == aIP
	}
	pb.next(t, 10*time.Second, "the re-probe at b's host", isRequestForB)
	if got := a.Drop("tx_unknown_neighbour"); got != before {
		t.Fatalf("the probe was dropped as tx_unknown_neighbour (%d -> %d)", before, got)
	}
}
