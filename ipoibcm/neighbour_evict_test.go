package ipoibcm

import (
	"errors"
	"log/slog"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// rvOnControlLoop runs fn on ifc's control loop and waits for it.
func rvOnControlLoop(t *testing.T, ifc *Interface, fn func()) {
	t.Helper()
	done := make(chan struct{})
	ifc.ctl.post(func() { fn(); close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("control loop did not run the work")
	}
}

// rvHostFrame runs a host frame through the reader's translation (as the
// host reader would) and reports whether it was sent or parked.
func rvHostFrame(t *testing.T, ifc *Interface, f []byte, now time.Time) bool {
	t.Helper()
	var idx [1]int
	if ifc.tx.pool.take(idx[:]) != 1 {
		t.Fatal("no TX buffer")
	}
	copy(ifc.tx.pool.bufs[idx[0]], f)
	ok := newHostReader(ifc, ifc.queues[0]).frame(idx[0], len(f), offload.Meta{}, now)
	if !ok {
		ifc.tx.pool.put1(idx[0])
	}
	return ok
}

// Neighbours silent for NeighbourEvictAfter (10 x NeighbourTimeout) with
// nothing referring to them are forgotten: their address handle destroyed,
// their MAC unmapped. A neighbour heard from recently, one with a passive
// connection to us, or one whose TX connection is still being torn down
// stays.
func TestIdleNeighboursEvicted(t *testing.T) {
	fab := rvFabric(t, 60)
	pa, pb := rvNewCapture(1), rvNewCapture(2)
	a := rvStart(t, fab, "a", pa, func(c *Config) { c.CM = rvSlowCM() })
	b := rvStart(t, fab, "b", pb, nil)
	if a.cfg.NeighbourEvictAfter != 10*DefaultNeighbourTimeout {
		t.Fatalf("NeighbourEvictAfter default %v", a.cfg.NeighbourEvictAfter)
	}
	src := frame.MAC(pa.mac)
	hostIP := [4]byte{10, 0, 0, 1}

	// b connects to a: a holds a passive connection from b.
	aMAC := rvLearn(b, a.HWAddr(), netip.AddrFrom4(hostIP), time.Now())
	pb.in <- rvIPv4(aMAC, frame.MAC(pb.mac), [4]byte{10, 0, 0, 2}, hostIP, 100)
	pa.next(t, 10*time.Second, "packet over b's connection", rvIsIPv4)

	now := time.Now()
	ip := func(k byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 2, k}) }
	// x: a datagram peer we sent to once (it has an address handle).
	xHW := frame.NewHWAddr(0, 0x201, rvFakeGID(1))
	xMAC := rvLearn(a, xHW, ip(1), now)
	if !rvHostFrame(t, a, rvIPv4(xMAC, src, hostIP, [4]byte{10, 0, 2, 1}, 100), now) {
		t.Fatal("UD send to x refused")
	}
	a.neigh.mu.Lock()
	xAH := a.neigh.byMAC[xMAC].ah
	a.neigh.mu.Unlock()
	if xAH == nil {
		t.Fatal("no address handle for x")
	}
	// y: silent for long, but heard from (ARP) a minute before the check.
	yMAC := rvLearn(a, frame.NewHWAddr(0, 0x202, rvFakeGID(2)), ip(2), now)
	// z: a 'C' peer that never answers; its frame is parked.
	zMAC := rvLearn(a, frame.NewHWAddr(frame.FlagRC, 0x203, rvFakeGID(3)), ip(3), now)
	if !rvHostFrame(t, a, rvIPv4(zMAC, src, hostIP, [4]byte{10, 0, 2, 3}, 100), now) {
		t.Fatal("frame to z not parked")
	}

	later := now.Add(a.cfg.NeighbourEvictAfter + time.Second)
	rvLearn(a, frame.NewHWAddr(0, 0x202, rvFakeGID(2)), ip(2), later.Add(-time.Minute))

	present := func() map[string]bool {
		m := map[string]bool{}
		for _, n := range a.Stats().Neighbours {
			m[n.MAC] = true
		}
		return m
	}
	bMAC := rvNeighbourMAC(t, a, b.HWAddr().GID())

	// First pass: x goes; z's connection is aged and torn down in the same
	// pass, so z is still referred to and stays.
	rvOnControlLoop(t, a, func() { a.neigh.age(later, &a.active, &a.passive); a.mcast.age(later) })
	got := present()
	if got[xMAC.String()] || !got[yMAC.String()] || !got[zMAC.String()] || !got[bMAC.String()] {
		t.Fatalf("after pass 1: %v; want y, z and b only (x %s y %s z %s b %s)", got, xMAC, yMAC, zMAC, bMAC)
	}
	if err := xAH.Destroy(); !errors.Is(err, hca.ErrDestroyed) {
		t.Fatalf("x's address handle not destroyed at eviction: %v", err)
	}
	if n := a.Stats().Reaper.NeighEvicted; n != 1 {
		t.Fatalf("neigh_evicted %d after pass 1", n)
	}

	// Second pass: z's connection is gone, so z goes too.
	rvOnControlLoop(t, a, func() { a.neigh.age(later, &a.active, &a.passive); a.mcast.age(later) })
	got = present()
	if got[zMAC.String()] || !got[yMAC.String()] || !got[bMAC.String()] || len(got) != 2 {
		t.Fatalf("after pass 2: %v; want y %s and b %s", got, yMAC, bMAC)
	}
	st := a.Stats()
	if st.Reaper.NeighEvicted != 2 {
		t.Fatalf("neigh_evicted %d after pass 2", st.Reaper.NeighEvicted)
	}

	// A host that still uses x's old MAC reaches nobody else, and x
	// relearnt gets a MAC the host never knew.
	before := a.Drop("tx_unknown_neighbour")
	if rvHostFrame(t, a, rvIPv4(xMAC, src, hostIP, [4]byte{10, 0, 2, 1}, 100), later) {
		t.Fatal("frame to an evicted MAC was sent")
	}
	if a.Drop("tx_unknown_neighbour") != before+1 {
		t.Fatal("frame to an evicted MAC not counted as tx_unknown_neighbour")
	}
	if again := rvLearn(a, xHW, ip(1), later); again == xMAC {
		t.Fatalf("relearnt x got its old MAC %s back at once", again)
	}
}

func rvNeighbourMAC(t *testing.T, ifc *Interface, gid hca.GID) frame.MAC {
	t.Helper()
	ifc.neigh.mu.Lock()
	defer ifc.neigh.mu.Unlock()
	n := ifc.neigh.byGID[gid]
	if n == nil {
		t.Fatalf("no neighbour for %s", gid)
	}
	return n.mac
}

// MAC indices are handed out cyclically: past 2^32-1 the counter wraps
// and skips indices still in use; a removed neighbour's index is free.
func TestNeighbourMACIndexWrapsAndSkipsUsed(t *testing.T) {
	var tb neighbourTable
	tb.init(&Config{}, hca.GID{}, hca.MTU4096, nil, nil, slog.Default(), nil)
	now := time.Now()
	hw := func(k int) frame.HWAddr { return frame.NewHWAddr(0, 1, rvFakeGID(k)) }
	n0, err := tb.lookupOrCreate(hw(0), now)
	if err != nil || n0.macIndex != 0 {
		t.Fatalf("first neighbour: index %d, %v", n0.macIndex, err)
	}
	tb.nextMAC = math.MaxUint32
	n1, _ := tb.lookupOrCreate(hw(1), now)
	n2, _ := tb.lookupOrCreate(hw(2), now)
	if n1.macIndex != math.MaxUint32 || n2.macIndex != 1 {
		t.Fatalf("indices %d, %d; want %d, 1 (0 in use)", n1.macIndex, n2.macIndex, uint32(math.MaxUint32))
	}
	tb.remove(n0)
	if tb.byGID[n0.gid] != nil || tb.lookupMAC(n0.mac) != nil {
		t.Fatal("removed neighbour still mapped")
	}
	tb.nextMAC = math.MaxUint32
	n3, _ := tb.lookupOrCreate(hw(3), now)
	if n3.macIndex != 0 || n3.mac != frame.LocalMAC(0) {
		t.Fatalf("freed index not reused on wrap: got %d", n3.macIndex)
	}
	for _, n := range []*neighbour{n1, n2, n3} {
		if tb.lookupMAC(n.mac) != n || tb.byGID[n.gid] != n {
			t.Fatalf("neighbour %d not mapped both ways", n.macIndex)
		}
	}
}
