package tap

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMulticastGroupsFollowSockets: a socket in the TAP's namespace
// joining a group on the TAP (IP_ADD_MEMBERSHIP, IPV6_JOIN_GROUP) puts it
// in MulticastGroups, leaving takes it out; the kernel's own groups are
// there throughout, and a group joined on another device is not.
func TestMulticastGroupsFollowSockets(t *testing.T) {
	requireRoot(t)
	ns := createNetns(t, testOwner(t), "mcast")
	d, err := Open(Config{Name: "ibt0", Netns: ns, Link: LinkConfig{Addrs: []netip.Prefix{netip.MustParsePrefix("10.99.1.1/24")}, Up: true}})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer d.Close()
	g4, g6 := netip.MustParseAddr("239.9.8.7"), netip.MustParseAddr("ff05::9:8:7")
	lo4 := netip.MustParseAddr("239.9.8.6")
	var c4, c6 net.PacketConn
	if err := ns.Do(func() error {
		var err error
		if c4, err = net.ListenPacket("udp4", "0.0.0.0:0"); err != nil {
			return err
		}
		c6, err = net.ListenPacket("udp6", "[::]:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	defer c6.Close()
	sockopt := func(c net.PacketConn, fn func(fd int) error) {
		t.Helper()
		rc, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = fn(int(fd)) }); err != nil || serr != nil {
			t.Fatalf("setsockopt: %v %v", err, serr)
		}
	}
	join4 := func(g netip.Addr, ifindex int, opt int) {
		sockopt(c4, func(fd int) error {
			return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, opt, &unix.IPMreqn{Multiaddr: g.As4(), Ifindex: int32(ifindex)})
		})
	}
	join6 := func(g netip.Addr, opt int) {
		sockopt(c6, func(fd int) error {
			return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, opt, &unix.IPv6Mreq{Multiaddr: g.As16(), Interface: uint32(d.index)})
		})
	}
	join4(g4, d.index, unix.IP_ADD_MEMBERSHIP)
	join4(lo4, 1, unix.IP_ADD_MEMBERSHIP) // on lo: not ours
	join6(g6, unix.IPV6_JOIN_GROUP)
	groups, err := d.MulticastGroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []netip.Addr{g4, g6, netip.MustParseAddr("224.0.0.1"), netip.MustParseAddr("ff02::1")} {
		if !slices.Contains(groups, want) {
			t.Errorf("groups %v lack %v", groups, want)
		}
	}
	if slices.Contains(groups, lo4) {
		t.Errorf("groups %v include %v, joined on lo", groups, lo4)
	}
	join4(g4, d.index, unix.IP_DROP_MEMBERSHIP)
	join6(g6, unix.IPV6_LEAVE_GROUP)
	groups, err = d.MulticastGroups()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(groups, g4) || slices.Contains(groups, g6) || !slices.Contains(groups, netip.MustParseAddr("224.0.0.1")) {
		t.Fatalf("after leaving: %v", groups)
	}
	d.Close()
	if _, err := d.MulticastGroups(); err == nil {
		t.Fatal("MulticastGroups on a closed device succeeded")
	}
}
