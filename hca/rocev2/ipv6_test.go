package rocev2

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/tap"
)

// borrowPort6 asks the kernel for a free UDP port on addr.
func borrowPort6(t *testing.T, addr netip.Addr) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		t.Skipf("no IPv6 on %v (%v): enable IPv6 on lo", addr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
}

// TestIPv6Loopback runs RC (both directions, multi-packet sizes) and UD
// multicast over IPv6 on ::1, one device talking to itself: the ICRC
// then covers a 40-byte IPv6 header whose variant fields are masked.
func TestIPv6Loopback(t *testing.T) {
	lo := netip.IPv6Loopback()
	d, err := New(Config{Bind: netip.AddrPortFrom(lo, borrowPort6(t, lo)), MinAckTimeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	if g := d.Port().GID; g.Addr() != lo {
		t.Fatalf("GID %v, want ::1", g)
	}
	a, b := newRCEnd(t, d, rcOpts{}), newRCEnd(t, d, rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	sendAndCheck(t, a, b, rcSizes)
	sendAndCheck(t, b, a, []int{7, 65520})

	// UD to the IPoIB broadcast MGID reaches the attached QP through
	// head-end replication to self.
	u := newUDEnd(t, d, 4)
	mgid := hca.GID(netip.MustParseAddr("ff12:401b:ffff::ffff:ffff").As16())
	if err := u.qp.AttachMcast(mgid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.qp.DetachMcast(mgid) })
	ah, err := d.CreateAH(mgid)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("who has 10.77.0.2? tell 10.77.0.1")
	if _, err := u.qp.PostSend([]hca.SendWR{{ID: 1, Data: msg, AH: ah, RemoteQPN: hca.QPNMulticast, RemoteQKey: testQKey}}); err != nil {
		t.Fatal(err)
	}
	var got hca.WC
	for _, wc := range u.cq.wait(t, 2) {
		if wc.Opcode == hca.WCRecv {
			got = wc
		}
	}
	if got.Status != hca.StatusSuccess || got.SrcQPN != u.qp.QPN() || got.SrcGID.Addr() != lo || !bytes.Equal(u.buf[got.ID][:got.ByteLen], msg) {
		t.Fatalf("multicast receive %+v", got)
	}
	if s := d.Stats(); s.TotalDropped() != 0 || s.Retransmits != 0 {
		t.Fatalf("drops or retransmits on a clean loopback: %+v", s)
	}
}

// TestIPv6TwoDevicesWithLoss runs two devices on two IPv6 addresses of a
// private namespace's loopback (root: a namespace keeps the host's lo
// untouched) with drops, duplicates and delays on both sides.
func TestIPv6TwoDevicesWithLoss(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (uid 0) to create a network namespace with IPv6 addresses on its lo")
	}
	owner := &tap.Owner{MarkerDir: t.TempDir()}
	ns, err := owner.Create(fmt.Sprintf("ipoibt-%d-rocev2-v6", os.Getpid()))
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		if err := ns.Delete(); err != nil {
			t.Errorf("delete netns: %v", err)
		}
	})
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []netip.Addr{netip.MustParseAddr("fd00:77::1"), netip.MustParseAddr("fd00:77::2")}
	for _, a := range addrs {
		if err := h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatalf("add %v: %v", a, err)
		}
	}
	var devs []*Device
	t.Cleanup(func() {
		for _, d := range devs {
			if err := d.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	faults := Faults{Drop: 0.03, Duplicate: 0.03, Reorder: 0.03, Delay: 0.03, DelayTime: 2 * time.Millisecond}
	err = ns.Do(func() error {
		for i, a := range addrs {
			f := faults
			f.Seed = uint64(i + 1)
			d, err := New(Config{Bind: netip.AddrPortFrom(a, 4791), Peers: addrs, Faults: f, MinAckTimeout: 50 * time.Millisecond})
			if err != nil {
				return err
			}
			devs = append(devs, d)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	o := rcOpts{retry: 7, rnrRetry: 7, minRNR: 1}
	a, b := newRCEnd(t, devs[0], o), newRCEnd(t, devs[1], o)
	connectRC(t, a, b, o, o)
	sizes := make([]int, 40)
	for i := range sizes {
		sizes[i] = 1 + (i*7919)%65520
	}
	sendAndCheck(t, a, b, sizes)
	sendAndCheck(t, b, a, rcSizes)
	sa := devs[0].Stats()
	if sa.FaultDropped == 0 || sa.Retransmits == 0 {
		t.Fatalf("faults not exercised: %+v", sa)
	}
	// The per-QP count adds up to the device's: each end has one RC QP
	// (and the GSI QP, which never retransmits).
	for i, e := range []*rcEnd{a, b} {
		n, ok := e.dev.QPRetransmits(e.qp.QPN())
		if total := devs[i].Stats().Retransmits; !ok || n != total {
			t.Fatalf("device %d: QP retransmits %d (found %v), device total %d", i, n, ok, total)
		}
	}
	if _, ok := a.dev.QPRetransmits(0xFFFFFF); ok {
		t.Fatal("QPRetransmits found a QP that does not exist")
	}
	// Every datagram's ICRC, computed over the IPv6 pseudo-header both
	// sides reconstruct, must verify.
	for _, d := range devs {
		if s := d.Stats(); s.Dropped(wire.DropBadICRC) != 0 || s.Dropped(wire.DropGarbage) != 0 {
			t.Fatalf("%s: bad ICRC %d, garbage %d", d.Name(), s.Dropped(wire.DropBadICRC), s.Dropped(wire.DropGarbage))
		}
	}
}
