package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/tap"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// mcastView is the part of a host's 'show --json' these tests read.
type mcastView struct {
	Stats struct {
		McastGroups []ipoibcm.McastGroupInfo `json:"mcast_groups"`
		Reaper      ipoibcm.ReaperStats      `json:"reaper"`
		Soft        struct {
			Mcast soft.McastStats `json:"mcast"`
		} `json:"soft"`
	} `json:"stats"`
}

func (v mcastView) group(mgid string) (ipoibcm.McastGroupInfo, bool) {
	for _, g := range v.Stats.McastGroups {
		if g.MGID == mgid {
			return g, true
		}
	}
	return ipoibcm.McastGroupInfo{}, false
}

// joinedAtFabric: the engine has the group as a full join and the soft
// fabric has the host's device attached to it.
func (v mcastView) joinedAtFabric(mgid string) bool {
	g, ok := v.group(mgid)
	return ok && g.State == "full" && g.Attached && slices.Contains(v.Stats.Soft.Mcast.Attached, mgid)
}

func (v mcastView) leftAtFabric(mgid string) bool {
	_, ok := v.group(mgid)
	return !ok && !slices.Contains(v.Stats.Soft.Mcast.Attached, mgid)
}

// showHost runs 'ipoib show --json --host host' against the lab.
func showHost(t *testing.T, dir, host string) mcastView {
	t.Helper()
	r := runCLI(t, Env{ControlDir: dir}, "show", "--json", "--host", host)
	var v []mcastView
	if r.code != ExitOK || json.Unmarshal([]byte(r.stdout), &v) != nil || len(v) != 1 {
		t.Fatalf("show --json --host %s: exit %d, %s %s", host, r.code, r.stdout, r.stderr)
	}
	return v[0]
}

// awaitShow reads the host's show until cond holds: the engine raises no
// event a test outside the process could wait on. The deadline turns a
// hang into a failure naming what was awaited.
func awaitShow(t *testing.T, dir, host, what string, cond func(mcastView) bool) mcastView {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		v := showHost(t, dir, host)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not reached; groups %+v, fabric %+v, mcast_joins %d, mcast_leaves %d", host, what,
				v.Stats.McastGroups, v.Stats.Soft.Mcast, v.Stats.Reaper.McastJoins, v.Stats.Reaper.McastLeaves)
		}
		<-tick.C
	}
}

// mcastSocket is a kernel UDP socket in one of the lab's namespaces.
type mcastSocket struct {
	t       *testing.T
	c       *net.UDPConn
	ifindex int // ib0's index in that namespace
}

// openMcastSocket opens a UDP socket of group's family in namespace ns,
// bound to port (0: any), sending multicast out of ifname.
func openMcastSocket(t *testing.T, ns, ifname string, group netip.Addr, port int) *mcastSocket {
	t.Helper()
	n, err := (&tap.Owner{MarkerDir: t.TempDir()}).Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	s := &mcastSocket{t: t}
	network, addr := "udp4", fmt.Sprintf("0.0.0.0:%d", port)
	if group.Is6() {
		network, addr = "udp6", fmt.Sprintf("[::]:%d", port)
	}
	if err := n.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		s.ifindex = ifi.Index
		pc, err := net.ListenPacket(network, addr)
		if err != nil {
			return err
		}
		s.c = pc.(*net.UDPConn)
		return nil
	}); err != nil {
		t.Fatalf("socket in %s: %v", ns, err)
	}
	t.Cleanup(func() { s.c.Close() })
	s.sockopt(func(fd int) error {
		if group.Is4() {
			return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(s.ifindex)})
		}
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, s.ifindex)
	})
	return s
}

func (s *mcastSocket) sockopt(fn func(fd int) error) {
	s.t.Helper()
	rc, err := s.c.SyscallConn()
	if err != nil {
		s.t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = fn(int(fd)) }); err != nil || serr != nil {
		s.t.Fatalf("setsockopt: %v %v", err, serr)
	}
}

// membership joins (IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP) or leaves group
// on ib0, as any multicast receiver does.
func (s *mcastSocket) membership(group netip.Addr, join bool) {
	s.t.Helper()
	s.sockopt(func(fd int) error {
		if group.Is4() {
			opt := unix.IP_DROP_MEMBERSHIP
			if join {
				opt = unix.IP_ADD_MEMBERSHIP
			}
			return unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, opt, &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(s.ifindex)})
		}
		opt := unix.IPV6_LEAVE_GROUP
		if join {
			opt = unix.IPV6_JOIN_GROUP
		}
		return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, opt, &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(s.ifindex)})
	})
}

func (s *mcastSocket) send(group netip.Addr, port int, msg string) {
	s.t.Helper()
	// The interface is the socket's IP_MULTICAST_IF / IPV6_MULTICAST_IF:
	// a zone name would be resolved in this thread's namespace.
	dst := &net.UDPAddr{IP: group.AsSlice(), Port: port}
	if _, err := s.c.WriteTo([]byte(msg), dst); err != nil {
		s.t.Fatalf("send to %v: %v", group, err)
	}
}

// expect reads the next datagram, which must be msg.
func (s *mcastSocket) expect(msg string) {
	s.t.Helper()
	buf := make([]byte, 1500)
	s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, _, err := s.c.ReadFrom(buf)
	if err != nil || string(buf[:n]) != msg {
		s.t.Fatalf("receive: %q %v, want %q", buf[:n], err, msg)
	}
}

// empty checks nothing is queued on the socket, without waiting.
func (s *mcastSocket) empty() {
	s.t.Helper()
	s.c.SetReadDeadline(time.Now())
	buf := make([]byte, 1500)
	if n, _, err := s.c.ReadFrom(buf); err == nil {
		s.t.Fatalf("received %q after leaving", buf[:n])
	}
}

// TestFabricMulticastJoinLeave is the acceptance test of host multicast
// membership on real kernel TAPs in namespaces over the soft fabric, with
// kernel sockets: receivers on two hosts join a group (the kernel sends
// IGMP/MLD, the engine joins the MGID), a third host sends; one receiver
// leaves and from then on the fabric delivers the group to its host no
// more, while the other still gets every datagram. IPv4 and IPv6, and a
// group the kernel never reports (224.0.0.x with
// igmp_link_local_mcast_reports=0), which only the host's own list
// (/proc/net/igmp) reveals.
func TestFabricMulticastJoinLeave(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.SkipIfNetns(t, "ipoib-h1", "ipoib-h2", "ipoib-h3")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	env := Env{
		Euid: os.Geteuid, ControlDir: dir, MarkerDir: t.TempDir(),
		fabricReady: func(string) {
			defer cancel()
			t.Run("IPv4", func(t *testing.T) { checkJoinLeave(t, dir, netip.MustParseAddr("239.77.1.1")) })
			t.Run("IPv6", func(t *testing.T) { checkJoinLeave(t, dir, netip.MustParseAddr("ff02::77:1")) })
			t.Run("unreported", func(t *testing.T) { checkListOnly(t, dir, netip.MustParseAddr("224.0.0.200")) })
		},
	}
	r := runCLIContext(ctx, t, env, "fabric", "--hosts", "3", "--prefix", "10.77.6.0/24", "--log-level", "warn")
	if r.code != ExitOK {
		t.Fatalf("fabric exit %d stderr %s", r.code, r.stderr)
	}
}

// awaitLinkLocal waits until ib0 in namespace ns has a link-local
// address that is no longer tentative (DAD done): the source of IPv6
// link-scope multicast.
func awaitLinkLocal(t *testing.T, ns string) {
	t.Helper()
	n, err := (&tap.Owner{MarkerDir: t.TempDir()}).Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		l, err := h.LinkByName("ib0")
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no usable link-local address on ib0: %v", ns, addrs)
		}
		<-tick.C
	}
}

func checkJoinLeave(t *testing.T, dir string, group netip.Addr) {
	const port = 7077
	if group.Is6() {
		awaitLinkLocal(t, "ipoib-h1")
	}
	mgid := frame.MulticastMGID(group, 0xFFFF).String()
	sender := openMcastSocket(t, "ipoib-h1", "ib0", group, 0)
	leaver := openMcastSocket(t, "ipoib-h2", "ib0", group, port)
	stayer := openMcastSocket(t, "ipoib-h3", "ib0", group, port)
	joins := showHost(t, dir, "ipoib-h2").Stats.Reaper.McastJoins
	leaver.membership(group, true)
	stayer.membership(group, true)
	for _, h := range []string{"ipoib-h2", "ipoib-h3"} {
		awaitShow(t, dir, h, "join of "+mgid, func(v mcastView) bool { return v.joinedAtFabric(mgid) })
	}
	if v := showHost(t, dir, "ipoib-h2"); v.Stats.Reaper.McastJoins != joins+1 {
		t.Fatalf("mcast_joins %d, want %d", v.Stats.Reaper.McastJoins, joins+1)
	}
	sender.send(group, port, "joined")
	leaver.expect("joined")
	stayer.expect("joined")
	if g, ok := showHost(t, dir, "ipoib-h1").group(mgid); !ok || g.State != "send-only" || g.Attached {
		t.Fatalf("sender's group %+v (present %v), want send-only", g, ok)
	}

	// show reads the counters and the group table at different moments,
	// so one snapshot may have the group gone and the leave not yet
	// counted: wait for both.
	leaves := showHost(t, dir, "ipoib-h2").Stats.Reaper.McastLeaves
	leaver.membership(group, false)
	v := awaitShow(t, dir, "ipoib-h2", "leave of "+mgid+" counted in mcast_leaves", func(v mcastView) bool {
		return v.leftAtFabric(mgid) && v.Stats.Reaper.McastLeaves == leaves+1
	})
	before := v.Stats.Soft.Mcast.Delivered[mgid]
	if before == 0 {
		t.Fatalf("the fabric never counted the group for ipoib-h2: %+v", v.Stats.Soft.Mcast)
	}
	const after = 20
	for k := range after {
		sender.send(group, port, fmt.Sprint("left ", k))
	}
	for k := range after {
		stayer.expect(fmt.Sprint("left ", k))
	}
	// The member that stayed has every datagram, so the fabric has
	// replicated each: the host that left got none at the fabric.
	if d := showHost(t, dir, "ipoib-h2").Stats.Soft.Mcast.Delivered[mgid]; d != before {
		t.Fatalf("the fabric delivered %d datagrams of %s to ipoib-h2 after it left", d-before, group)
	}
	if d := showHost(t, dir, "ipoib-h3").Stats.Soft.Mcast.Delivered[mgid]; d < before+after {
		t.Fatalf("ipoib-h3's fabric count %d, want at least %d", d, before+after)
	}
	leaver.empty()
	stayer.membership(group, false)
	awaitShow(t, dir, "ipoib-h3", "leave of "+mgid, func(v mcastView) bool { return v.leftAtFabric(mgid) })
}

// checkListOnly: with igmp_link_local_mcast_reports=0 the kernel sends no
// report for 224.0.0.x, so only the host's own list tells the engine; it
// joins and leaves within the list's poll.
func checkListOnly(t *testing.T, dir string, group netip.Addr) {
	n, err := (&tap.Owner{MarkerDir: t.TempDir()}).Open("ipoib-h2")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/igmp_link_local_mcast_reports", []byte("0"), 0)
	}); err != nil {
		t.Skipf("igmp_link_local_mcast_reports not settable: %v", err)
	}
	mgid := frame.MulticastMGID(group, 0xFFFF).String()
	rx := openMcastSocket(t, "ipoib-h2", "ib0", group, 7078)
	rx.membership(group, true)
	awaitShow(t, dir, "ipoib-h2", "list join of "+mgid, func(v mcastView) bool { return v.joinedAtFabric(mgid) })
	tx := openMcastSocket(t, "ipoib-h1", "ib0", group, 0)
	tx.send(group, 7078, "listed")
	rx.expect("listed")
	rx.membership(group, false)
	awaitShow(t, dir, "ipoib-h2", "list leave of "+mgid, func(v mcastView) bool { return v.leftAtFabric(mgid) })
}
