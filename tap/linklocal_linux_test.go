package tap

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestLinkLocalIsNoDAD: the GUID-derived link-local carries IFA_F_NODAD
// as the kernel reports it back, so it is usable the moment it is added
// (a tentative address cannot be bound), on first up and after the link
// goes down and up again.
func TestLinkLocalIsNoDAD(t *testing.T) {
	ll := netip.MustParseAddr("fe80::200:ffff:a63:2")
	ns, d := linkLocalDevice(t, "nodad", "ibt3", ll)
	for i, up := range []bool{true, false, true} {
		if i > 0 {
			if err := d.SetLinkUp(up); err != nil {
				t.Fatal(err)
			}
		}
		if !up {
			continue
		}
		flags, ok := addrFlags(t, ns, "ibt3", ll)
		if !ok {
			t.Fatalf("step %d: %v not on ibt3", i, ll)
		}
		t.Logf("step %d: %v flags %#x", i, ll, flags)
		if flags&unix.IFA_F_NODAD == 0 || flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			t.Fatalf("step %d: %v flags %#x, want IFA_F_NODAD (%#x) and neither tentative nor dadfailed",
				i, ll, flags, unix.IFA_F_NODAD)
		}
		if err := ns.Do(func() error {
			c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ll.WithZone("ibt3"), 0)))
			if err != nil {
				return err
			}
			return c.Close()
		}); err != nil {
			t.Fatalf("step %d: bind to %v right after up: %v", i, ll, err)
		}
	}
}

// linkLocalDevice is a TAP named dev in a fresh namespace, up (as a lab
// whose engine restarts finds it: the kernel's MAC-derived link-local is
// there), given the link-local ll; it is closed when the test ends.
func linkLocalDevice(t *testing.T, tag, dev string, ll netip.Addr) (*Netns, *Device) {
	t.Helper()
	requireRoot(t)
	ns := createNetns(t, testOwner(t), tag)
	d, err := Open(Config{Name: dev, Netns: ns})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.SetLinkUp(true); err != nil {
		t.Fatal(err)
	}
	if err := d.SetLinkLocal(ll); err != nil {
		t.Fatal(err)
	}
	return ns, d
}

// addrFlags returns the IFA_FLAGS the kernel reports for addr on link.
func addrFlags(t *testing.T, ns *Netns, link string, addr netip.Addr) (int, bool) {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	as, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip == addr {
			return a.Flags, true
		}
	}
	return 0, false
}
