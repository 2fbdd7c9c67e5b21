package rocev2

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

func mgidOf(s string) hca.GID { return hca.GID(netip.MustParseAddr(s).As16()) }

func TestGroupAddr(t *testing.T) {
	for _, c := range []struct{ mgid, v4 string }{
		{"ff12:401b:ffff::ffff:ffff", "239.255.255.255"}, // IPoIB broadcast, default partition
		{"ff12:401b:ffff::1", "239.0.0.1"},               // all-hosts 224.0.0.1
		{"ff12:601b:ffff::1", "239.0.0.1"},               // all-nodes ff02::1: shares all-hosts' group
		{"ff12:601b:ffff::1:ff00:2", "239.0.0.2"},        // solicited-node of ...::2
		{"ff12:401b:ffff::f01:203", "239.1.2.3"},         // 239.1.2.3 (low 28 bits 0xf010203)
		{"ff12:401b:ffff::101:203", "239.1.2.3"},         // 225.1.2.3: collides, bits 24-27 lost
		{"ff12:401b:8001::ffff:ffff", "239.128.1.255"},   // broadcast of partition 0x8001
		{"ff12:401b:8002::ffff:ffff", "239.128.2.255"},
	} {
		g, ok := GroupAddr(mgidOf(c.mgid), true)
		if want := netip.MustParseAddr(c.v4); !ok || g != want {
			t.Errorf("GroupAddr(%s, v4) = %v %v, want %v", c.mgid, g, ok, want)
		}
		if g6, ok := GroupAddr(mgidOf(c.mgid), false); !ok || g6 != netip.MustParseAddr(c.mgid) {
			t.Errorf("GroupAddr(%s, v6) = %v %v, want the MGID", c.mgid, g6, ok)
		}
		if g.IsMulticast() != true || !netip.MustParsePrefix("239.0.0.0/8").Contains(g) {
			t.Errorf("GroupAddr(%s) = %v, outside 239/8", c.mgid, g)
		}
	}
	if _, ok := GroupAddr(mgidOf("::ffff:10.0.0.1"), true); ok {
		t.Error("a unicast GID mapped to a group")
	}
}

// enterPrivateNetns moves the test goroutine's thread into a new network
// namespace holding one veth pair, mc0 (up, multicast, carrying addrs)
// and mc1 (up). The thread stays locked: it ends with the test goroutine,
// so the namespace goes with the test. Group sockets open in the calling
// thread's namespace, so AttachMcast must run on this goroutine.
func enterPrivateNetns(t *testing.T, addrs ...netip.Addr) {
	t.Helper()
	runtime.LockOSThread() // never unlocked, on purpose
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Skipf("multicast test needs a private network namespace (CAP_SYS_ADMIN): %v", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mc0", MTU: 9000}, PeerName: "mc1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Skipf("multicast test needs veth: %v", err)
	}
	for _, name := range []string{"lo", "mc1", "mc0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	l, err := h.LinkByName("mc0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(l, na); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range addrs {
		if err := awaitLocal(a); err != nil {
			t.Fatal(err)
		}
	}
}

// kernelGroups lists the groups the kernel reports membership of on
// interface ifname (IGMP, MLD), from this thread's namespace.
func kernelGroups(t *testing.T, ifname string, v6 bool) map[netip.Addr]bool {
	t.Helper()
	out := make(map[netip.Addr]bool)
	if v6 {
		b, err := os.ReadFile("/proc/thread-self/net/igmp6")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[1] != ifname {
				continue
			}
			raw, err := hex.DecodeString(f[2])
			if a, ok := netip.AddrFromSlice(raw); err == nil && ok {
				out[a] = true
			}
		}
		return out
	}
	b, err := os.ReadFile("/proc/thread-self/net/igmp")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, " "):
			in = f[1] == ifname || f[1] == ifname+":"
		case in && len(f) >= 1 && len(f[0]) == 8:
			var v [4]byte
			if _, err := fmt.Sscanf(f[0], "%02X%02X%02X%02X", &v[3], &v[2], &v[1], &v[0]); err == nil {
				out[netip.AddrFrom4(v)] = true
			}
		}
	}
	return out
}

// TestMulticastGroups runs two devices with Config.Multicast on one
// interface: a send to an MGID reaches every QP attached to its group
// exactly once (the sender's own included, through IP_MULTICAST_LOOP)
// and never a QP that is not attached; the kernel holds the membership
// from the first attachment to the last detachment; a datagram to a
// group no QP with its Q_Key is attached to is counted not_attached.
func TestMulticastGroups(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "IPv4"
		if v6 {
			name = "IPv6"
		}
		t.Run(name, func(t *testing.T) { testMulticastGroups(t, v6) })
	}
}

func testMulticastGroups(t *testing.T, v6 bool) {
	addrs := []netip.Addr{netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.99.0.2")}
	if v6 {
		addrs = []netip.Addr{netip.MustParseAddr("fd99::1"), netip.MustParseAddr("fd99::2")}
	}
	enterPrivateNetns(t, addrs...)
	f := newTestFabric(t, 0, Faults{})
	var devs [2]*Device
	for i, a := range addrs {
		devs[i] = f.open(t, Config{Bind: netip.AddrPortFrom(a, wire.RoCEv2Port), Multicast: true, MinAckTimeout: 250 * time.Millisecond,
			Name: fmt.Sprintf("%s/%d", t.Name(), i)})
	}
	a, b := devs[0], devs[1]
	bcast := mgidOf("ff12:401b:ffff::ffff:ffff")
	other := mgidOf("ff12:401b:ffff::f01:203")
	sender, got, notAttached := newUDEnd(t, a, 8), newUDEnd(t, b, 8), newUDEnd(t, b, 8)
	for _, e := range []*udEnd{sender, got} {
		if err := e.qp.AttachMcast(bcast); err != nil {
			t.Fatal(err)
		}
	}
	if err := notAttached.qp.AttachMcast(other); err != nil {
		t.Fatal(err)
	}
	group := func(m hca.GID) netip.Addr { g, _ := GroupAddr(m, !v6); return g }
	if k := kernelGroups(t, "mc0", v6); !k[group(bcast)] || !k[group(other)] {
		t.Fatalf("kernel memberships on mc0 %v, want %v and %v", k, group(bcast), group(other))
	}

	ah, err := a.CreateAH(bcast)
	if err != nil {
		t.Fatal(err)
	}
	msgs := [][]byte{[]byte("who has 10.77.0.2? tell 10.77.0.1"), []byte("second")}
	for i, m := range msgs {
		if _, err := sender.qp.PostSend([]hca.SendWR{{ID: 100 + uint64(i), Data: m, AH: ah, RemoteQPN: hca.QPNMulticast, RemoteQKey: testQKey}}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(who string, wcs []hca.WC, e *udEnd) {
		t.Helper()
		var n int
		for _, wc := range wcs {
			if wc.Opcode != hca.WCRecv {
				continue
			}
			if wc.Status != hca.StatusSuccess || wc.SrcQPN != sender.qp.QPN() || wc.SrcGID.Addr() != addrs[0] ||
				!bytes.Equal(e.buf[wc.ID][:wc.ByteLen], msgs[n]) {
				t.Fatalf("%s: receive %d: %+v %q", who, n, wc, e.buf[wc.ID][:wc.ByteLen])
			}
			n++
		}
		if n != len(msgs) {
			t.Fatalf("%s: %d receives of %d: %+v", who, n, len(msgs), wcs)
		}
	}
	check("sender (own copy)", sender.cq.wait(t, 4), sender) // 2 sends + 2 receives
	check("attached", got.cq.wait(t, 2), got)
	f.waitRx(t, b, func(s Stats) bool { return s.McastDelivered == 2 })
	if s := a.Stats(); s.McastDelivered != 2 || s.McastJoins != 1 {
		t.Fatalf("sender stats: delivered %d joins %d", s.McastDelivered, s.McastJoins)
	}

	// A datagram on B's other group that no QP with its Q_Key takes.
	ah2, err := a.CreateAH(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sender.qp.PostSend([]hca.SendWR{{ID: 200, Data: []byte("x"), AH: ah2, RemoteQPN: hca.QPNMulticast, RemoteQKey: testQKey + 1}}); err != nil {
		t.Fatal(err)
	}
	sender.cq.wait(t, 1)
	f.waitRx(t, b, func(s Stats) bool { return s.Dropped(wire.DropNotAttached) == 1 })
	if n := notAttached.cq.Poll(make([]hca.WC, 4)); n != 0 {
		t.Fatalf("a QP attached to another group got %d completions", n)
	}

	// The last detachment on a device leaves; the kernel keeps the
	// membership while the other device's socket holds it.
	if err := got.qp.DetachMcast(bcast); err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.McastLeaves != 1 || len(b.Groups()) != 1 {
		t.Fatalf("B after detach: leaves %d groups %v", s.McastLeaves, b.Groups())
	}
	if !kernelGroups(t, "mc0", v6)[group(bcast)] {
		t.Fatal("kernel left the group while A is still attached")
	}
	for _, d := range []struct {
		e *udEnd
		m hca.GID
	}{{sender, bcast}, {notAttached, other}} {
		if err := d.e.qp.DetachMcast(d.m); err != nil {
			t.Fatal(err)
		}
	}
	if k := kernelGroups(t, "mc0", v6); k[group(bcast)] || k[group(other)] {
		t.Fatalf("kernel memberships after every detach: %v", k)
	}
	if o := a.Objects(); o.McastAttachments != 0 || len(a.Groups()) != 0 {
		t.Fatalf("A still holds %d attachments, groups %v", o.McastAttachments, a.Groups())
	}
}

// TestMulticastSharedGroup attaches two MGIDs that map to one IPv4
// group: one join, kept until both are detached.
func TestMulticastSharedGroup(t *testing.T) {
	addr := netip.MustParseAddr("10.99.0.1")
	enterPrivateNetns(t, addr)
	f := newTestFabric(t, 0, Faults{})
	d := f.open(t, Config{Bind: netip.AddrPortFrom(addr, wire.RoCEv2Port), Multicast: true, Name: t.Name()})
	e := newUDEnd(t, d, 1)
	m1, m2 := mgidOf("ff12:401b:ffff::1"), mgidOf("ff12:601b:ffff::1")
	for _, m := range []hca.GID{m1, m2, m1} { // the second m1 is a no-op
		if err := e.qp.AttachMcast(m); err != nil {
			t.Fatal(err)
		}
	}
	want := netip.MustParseAddr("239.0.0.1")
	if g := d.Groups(); len(g) != 1 || g[0] != want || d.Stats().McastJoins != 1 {
		t.Fatalf("groups %v joins %d, want [%v] and 1", g, d.Stats().McastJoins, want)
	}
	if err := e.qp.DetachMcast(m1); err != nil {
		t.Fatal(err)
	}
	if !kernelGroups(t, "mc0", false)[want] {
		t.Fatal("group left while m2 is attached")
	}
	if err := e.qp.DetachMcast(m2); err != nil {
		t.Fatal(err)
	}
	if kernelGroups(t, "mc0", false)[want] || d.Stats().McastLeaves != 1 {
		t.Fatalf("group kept after the last detach; leaves %d", d.Stats().McastLeaves)
	}
}

// A loopback address that no interface holds is on lo, whose 127.0.0.1/8
// covers it; an address nowhere is refused.
func TestBindInterface(t *testing.T) {
	ifi, err := BindInterface(netip.MustParseAddr("127.0.0.2"))
	if err != nil || ifi.Flags&net.FlagLoopback == 0 {
		t.Fatalf("127.0.0.2: %v %v", ifi, err)
	}
	if ifi, err := BindInterface(netip.MustParseAddr("192.0.2.254")); err == nil {
		t.Fatalf("192.0.2.254 (TEST-NET-1) found on %s", ifi.Name)
	}
}

// TestMulticastLeaveAtTheBridge puts the device behind a Linux bridge
// with IGMP snooping (querier on, fast leave on the port): attaching
// makes the bridge forward the group to the device's port (the join
// reached the fabric), the last detach removes the port from the
// bridge's group (the leave did too, not just the host's socket).
func TestMulticastLeaveAtTheBridge(t *testing.T) {
	for _, tool := range []string{"ip", "bridge"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (iproute2)", tool)
		}
	}
	addr := netip.MustParseAddr("10.99.0.1")
	enterPrivateNetns(t) // the commands below run in it: exec forks from this thread
	for _, c := range [][]string{
		{"ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "1", "mcast_querier", "1"},
		{"ip", "link", "set", "mc1", "master", "br0"},
		{"bridge", "link", "set", "dev", "mc1", "fastleave", "on"},
		{"ip", "link", "set", "br0", "up"},
		{"ip", "addr", "add", addr.String() + "/24", "dev", "mc0"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Skipf("%v: %v %s", c, err, out)
		}
	}
	if err := awaitLocal(addr); err != nil {
		t.Fatal(err)
	}
	f := newTestFabric(t, 0, Faults{})
	d := f.open(t, Config{Bind: netip.AddrPortFrom(addr, wire.RoCEv2Port), Multicast: true, Name: t.Name()})
	e := newUDEnd(t, d, 1)
	bcast := mgidOf("ff12:401b:ffff::ffff:ffff")
	// Every change of the bridge's MDB is an rtnetlink notification
	// (RTNLGRP_MDB): the wake-up; the table itself is then read.
	sub, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_MDB)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetReceiveTimeout(&unix.Timeval{Usec: 100000}); err != nil {
		t.Fatal(err)
	}
	wake, stop := make(chan struct{}, 1), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if msgs, _, err := sub.Receive(); err == nil && len(msgs) > 0 {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done; sub.Close() })
	inMDB := func() bool {
		out, err := exec.Command("bridge", "mdb", "show", "dev", "br0").CombinedOutput()
		if err != nil {
			t.Fatalf("bridge mdb: %v %s", err, out)
		}
		return strings.Contains(string(out), "port mc1 grp 239.255.255.255")
	}
	waitMDB := func(want bool) {
		t.Helper()
		guard := time.NewTimer(10 * time.Second)
		defer guard.Stop()
		for inMDB() != want {
			select {
			case <-wake:
			case <-guard.C:
				out, _ := exec.Command("bridge", "mdb", "show").CombinedOutput()
				t.Fatalf("port mc1 in the bridge's 239.255.255.255: want %v; mdb:\n%s", want, out)
			}
		}
	}
	if err := e.qp.AttachMcast(bcast); err != nil {
		t.Fatal(err)
	}
	waitMDB(true)
	if err := e.qp.DetachMcast(bcast); err != nil {
		t.Fatal(err)
	}
	waitMDB(false)
}
