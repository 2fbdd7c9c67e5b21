package ipoibcm

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// udBatch is an Interface whose RX path the test hands UD completions to
// itself, one handleRX call per batch, so that which packets share a batch
// is the test's choice.
type udBatch struct {
	ifc *Interface
	wcs []hca.WC
	// next is the next UD receive buffer to fill: each message takes a
	// fresh one, as the fabric's would, so none the RX path still holds
	// is written over.
	next int
}

func newUDBatch(t *testing.T) *udBatch {
	return newUDBatchOn(t, newMemPort(1, nil))
}

// newUDBatchOn is newUDBatch with host port and config tweaks of the
// test's.
func newUDBatchOn(t *testing.T, port HostPort, tweak ...func(*Config)) *udBatch {
	fab := soft.NewFabric(soft.Config{Seed: 31})
	t.Cleanup(func() { fab.Close() })
	dev, err := fab.NewDevice("engine")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Device: dev, Host: port, Mode: ModeDatagram, CM: fastCM()}
	for _, f := range tweak {
		f(&cfg)
	}
	ifc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ifc.Close() })
	return &udBatch{ifc: ifc}
}

// add puts an IPoIB message from gid and qpn into the next UD receive
// buffer of the batch.
func (u *udBatch) add(gid hca.GID, qpn hca.QPN, et uint16, body []byte) {
	k := u.next % len(u.ifc.ud.bufs)
	u.next++
	b := u.ifc.ud.bufs[k]
	frame.PutEncap(b[headroom:], et)
	n := frame.EncapLen + copy(b[headroom+frame.EncapLen:], body)
	u.wcs = append(u.wcs, hca.WC{ID: wrID(wrKindUDRecv, k), Opcode: hca.WCRecv, ByteLen: n, SrcQPN: qpn, SrcGID: gid, Context: &udQP{}})
}

// addIPv4 adds a UDP packet from src.
func (u *udBatch) addIPv4(gid hca.GID, qpn hca.QPN, src netip.Addr) {
	ip := make([]byte, 28)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], 28)
	ip[8], ip[9] = 64, 17
	a := src.As4()
	copy(ip[12:16], a[:])
	copy(ip[16:20], []byte{10, 0, 0, 9})
	u.add(gid, qpn, frame.EtherTypeIPv4, ip)
}

// addARP adds an ARP request whose sender is qpn at gid.
func (u *udBatch) addARP(gid hca.GID, qpn hca.QPN, src netip.Addr) {
	a := frame.IPoIBARP{
		ARP:      frame.ARP{Op: frame.ARPRequest, SenderIP: src, TargetIP: netip.MustParseAddr("10.0.0.9")},
		SenderHW: frame.NewHWAddr(0, qpn, gid),
	}
	body := make([]byte, frame.IPoIBARPLen)
	a.Marshal(body)
	u.add(gid, qpn, frame.EtherTypeARP, body)
}

// run hands the batch to the RX path in one call.
func (u *udBatch) run() {
	u.ifc.rxNAPI.Sync(func() { u.ifc.rx.handleRX(u.wcs) })
	u.wcs = u.wcs[:0]
}

// neighbour is what the table holds for gid: its hardware address, its
// addresses, when it was last heard and the restarts counted so far.
func (u *udBatch) neighbour(t *testing.T, gid hca.GID) (frame.HWAddr, []netip.Addr, time.Time, uint64) {
	t.Helper()
	nt := &u.ifc.neigh
	nt.mu.Lock()
	defer nt.mu.Unlock()
	n := nt.lookupGID(gid)
	if n == nil {
		t.Fatalf("no neighbour for %v", gid)
	}
	return n.hw, slices.Clone(n.ips), n.lastSeen, nt.ctr.restarts.Load()
}

// TestUDSourceLearnsAfterARPInBatch: the RX path remembers the neighbour of
// a batch's previous UD source (udNeighbour), and must forget it when the
// batch itself learns: an ARP in mid-batch moves the peer to another QPN,
// and the next IP packet from the old QPN moves it back, as each would
// alone. With the remembered neighbour kept across the ARP the last packet
// would learn nothing and the neighbour would stay at the ARP's QPN.
func TestUDSourceLearnsAfterARPInBatch(t *testing.T) {
	u := newUDBatch(t)
	gid := hca.GID{0xfe, 0x80, 15: 0x42}
	src := netip.MustParseAddr("10.0.0.5")
	const qpnA, qpnB = hca.QPN(0x100), hca.QPN(0x200)
	u.addIPv4(gid, qpnA, src)
	u.addIPv4(gid, qpnA, src)
	u.addARP(gid, qpnB, src)
	u.addIPv4(gid, qpnA, src)
	u.run()
	hw, _, _, restarts := u.neighbour(t, gid)
	if hw.QPN() != qpnA || restarts != 2 {
		t.Fatalf("after IP from %#x, ARP from %#x, IP from %#x in one batch: neighbour at %#x, %d restarts; want %#x and 2", qpnA, qpnB, qpnA, hw.QPN(), restarts, qpnA)
	}
	for reason, n := range u.ifc.Stats().Drops {
		if n != 0 {
			t.Fatalf("%d dropped as %s", n, reason)
		}
	}
}

// TestUDSourceKeyedByAddressAndBatch: a second IP address from the same
// source in one batch is learnt too, and the first packet of the next
// batch from a source already seen learns again (its last-heard time moves
// on), so a remembered source never outlives the batch that learnt it.
func TestUDSourceKeyedByAddressAndBatch(t *testing.T) {
	u := newUDBatch(t)
	gid := hca.GID{0xfe, 0x80, 15: 0x43}
	a, b := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")
	const qpn = hca.QPN(0x100)
	u.addIPv4(gid, qpn, a)
	u.addIPv4(gid, qpn, a)
	u.addIPv4(gid, qpn, b)
	u.run()
	_, ips, seen, _ := u.neighbour(t, gid)
	if !slices.Contains(ips, a) || !slices.Contains(ips, b) {
		t.Fatalf("neighbour addresses %v, want %v and %v", ips, a, b)
	}
	time.Sleep(2 * time.Millisecond)
	u.addIPv4(gid, qpn, b)
	u.run()
	if _, _, seen2, _ := u.neighbour(t, gid); !seen2.After(seen) {
		t.Fatalf("last heard %v after the second batch, %v after the first", seen2, seen)
	}
}
