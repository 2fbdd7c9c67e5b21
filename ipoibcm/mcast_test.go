package ipoibcm

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// awaitCond waits until cond holds, for state the engine raises no event
// for (its tables and counters), reading it again every millisecond. The
// deadline only turns a hang into a failure that says what was awaited,
// and detail (if set) what the engine looked like.
func awaitCond(t testing.TB, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			msg := ""
			for _, d := range detail {
				msg += "; " + d()
			}
			t.Fatalf("timed out waiting for %s%s", what, msg)
		case <-tick.C:
		}
	}
}

// mcastGroupOf is the Stats entry of mgid, if any.
func mcastGroupOf(ifc *Interface, group netip.Addr) (McastGroupInfo, bool) {
	mgid := frame.MulticastMGID(group, ifc.cfg.PKey).String()
	for _, g := range ifc.Stats().McastGroups {
		if g.MGID == mgid {
			return g, true
		}
	}
	return McastGroupInfo{}, false
}

func fabricDelivered(dev *soft.Device, group netip.Addr) uint64 {
	return dev.McastStats().Delivered[frame.MulticastMGID(group, 0xFFFF).String()]
}

func fabricAttached(dev *soft.Device, group netip.Addr) bool {
	return slices.Contains(dev.McastStats().Attached, frame.MulticastMGID(group, 0xFFFF).String())
}

// udpReceiver counts what a gVisor UDP socket receives.
func udpReceiver(t *testing.T, h *netstack.Host, group netip.Addr, port uint16) (chan string, func()) {
	t.Helper()
	any := netip.IPv4Unspecified()
	if group.Is6() {
		any = netip.IPv6Unspecified()
	}
	c, err := h.ListenUDP(netip.AddrPortFrom(any, port))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 256)
	go func() {
		buf := make([]byte, 2000)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			select {
			case got <- string(buf[:n]):
			default: // the test fails on what it counted; never block the reader
			}
		}
	}()
	return got, func() { c.Close() }
}

// TestHostMcastLeaveStopsAtFabric: two hosts join a group (IGMP/MLD from
// their gVisor stacks), a third sends; one host leaves and from then on
// the fabric no longer delivers the group to its device, while the other
// member still gets every datagram.
func TestHostMcastLeaveStopsAtFabric(t *testing.T) {
	for _, group := range []netip.Addr{netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("ff05::1:3")} {
		t.Run(group.String(), func(t *testing.T) {
			tn := newTestNet(t, 3, soft.Config{Seed: 31}, nil)
			sender, leaver, stayer := tn.nodes[0], tn.nodes[1], tn.nodes[2]
			var recv []chan string
			for _, nd := range []*testNode{leaver, stayer} {
				if err := nd.host.JoinMulticast(group); err != nil {
					t.Fatal(err)
				}
				got, closeFn := udpReceiver(t, nd.host, group, 7000)
				defer closeFn()
				recv = append(recv, got)
			}
			for _, nd := range []*testNode{leaver, stayer} {
				awaitCond(t, "full join", func() bool {
					g, ok := mcastGroupOf(nd.ifc, group)
					return ok && g.State == "full" && g.Attached && fabricAttached(nd.dev, group)
				})
			}
			s, err := sender.host.DialUDP(netip.AddrPortFrom(group, 7000))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for k, got := range recv {
				if _, err := s.Write([]byte("joined")); err != nil {
					t.Fatal(err)
				}
				waitMsg(t, got, "joined", k)
				<-recv[1-k] // the other member's copy of the same datagram
			}
			if g, ok := mcastGroupOf(sender.ifc, group); !ok || g.State != "send-only" || g.Attached {
				t.Fatalf("sender's group %+v (present %v), want send-only, not attached", g, ok)
			}
			if fabricDelivered(sender.dev, group) != 0 {
				t.Fatal("the fabric delivered the group to the sender, which never joined")
			}

			leaves := leaver.ifc.Stats().Reaper.McastLeaves
			if err := leaver.host.LeaveMulticast(group); err != nil {
				t.Fatal(err)
			}
			awaitCond(t, "leave at the fabric", func() bool {
				_, ok := mcastGroupOf(leaver.ifc, group)
				return !ok && !fabricAttached(leaver.dev, group)
			})
			if got := leaver.ifc.Stats().Reaper.McastLeaves; got != leaves+1 {
				t.Fatalf("mcast_leaves %d, want %d", got, leaves+1)
			}
			before := fabricDelivered(leaver.dev, group)
			const after = 20
			for range after {
				if _, err := s.Write([]byte("left")); err != nil {
					t.Fatal(err)
				}
			}
			for k := range after {
				waitMsg(t, recv[1], "left", k)
			}
			// The stayer has all of them, so the fabric has replicated
			// every one: the leaver's device got none.
			if d := fabricDelivered(leaver.dev, group); d != before {
				t.Fatalf("fabric delivered %d datagrams to the device that left", d-before)
			}
			select {
			case m := <-recv[0]:
				t.Fatalf("the host that left received %q", m)
			default:
			}
		})
	}
}

func waitMsg(t *testing.T, got chan string, want string, k int) {
	t.Helper()
	select {
	case m := <-got:
		if m != want {
			t.Fatalf("datagram %d: %q, want %q", k, m, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("datagram %d (%q) never arrived", k, want)
	}
}

// TestHostMcastSendOnlyAgesOut: a group the host only sends to is a
// send-only group, never attached, collected once the host stops.
func TestHostMcastSendOnlyAgesOut(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 32}, func(k int, c *Config) { c.McastSendOnlyTimeout = 50 * time.Millisecond })
	group := netip.MustParseAddr("239.7.7.7")
	nd := tn.nodes[0]
	s, err := nd.host.DialUDP(netip.AddrPortFrom(group, 7001))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var seen McastGroupInfo
	awaitCond(t, "send-only group", func() bool {
		g, ok := mcastGroupOf(nd.ifc, group)
		seen = g
		return ok
	})
	if seen.State != "send-only" || seen.Attached || !slices.Equal(seen.Groups, []string{group.String()}) {
		t.Fatalf("group %+v, want send-only to %v, not attached", seen, group)
	}
	if fabricAttached(nd.dev, group) {
		t.Fatal("a send-only group is attached at the fabric")
	}
	awaitCond(t, "send-only group aged out", func() bool {
		_, ok := mcastGroupOf(nd.ifc, group)
		return !ok
	})
	if st := nd.ifc.Stats().Reaper; st.McastSendOnly == 0 || st.McastSendOnlyExpired == 0 {
		t.Fatalf("reaper %+v: send-only created/expired not counted", st)
	}
	checkMcastCounts(t, nd.ifc)
}

// checkMcastCounts: the table's counts agree with its entries.
func checkMcastCounts(t *testing.T, ifc *Interface) {
	t.Helper()
	ifc.mcast.mu.Lock()
	defer ifc.mcast.mu.Unlock()
	host, sendOnly := 0, 0
	for _, g := range ifc.mcast.groups {
		if g.state != mcastDefault {
			host++
		}
		if g.state == mcastSendOnly {
			sendOnly++
		}
		if g.attached != (g.state != mcastSendOnly) {
			t.Errorf("group %+v: attached %v in state %v", g, g.attached, g.state)
		}
	}
	if host != ifc.mcast.host || sendOnly != ifc.mcast.sendOnly {
		t.Fatalf("counts host %d send-only %d, entries say %d and %d", ifc.mcast.host, ifc.mcast.sendOnly, host, sendOnly)
	}
}

// mcastPortNode is an interface whose host is a memPort the test writes
// IGMP/MLD frames into.
func mcastPortNode(t *testing.T, tweak func(*Config)) (*Interface, *memPort, *soft.Device) {
	t.Helper()
	fab := rvFabric(t, 33)
	port := newMemPort(1, nil)
	ifc := rvStart(t, fab, "h1", port, tweak)
	dev := ifc.dev.(*soft.Device)
	return ifc, port, dev
}

// hostFrame is an Ethernet frame from the memPort host carrying the IP packet p.
func hostFrame(port *memPort, etherType uint16, p []byte) []byte {
	b := make([]byte, frame.EthHdrLen+len(p))
	frame.PutEthernet(b, frame.EthHeader{Dst: frame.MAC{0x01, 0x00, 0x5e, 0, 0, 22}, Src: frame.MAC(port.mac), EtherType: etherType})
	copy(b[frame.EthHdrLen:], p)
	return b
}

func joinRecs(groups ...netip.Addr) []v2Record {
	var recs []v2Record
	for _, g := range groups {
		recs = append(recs, v2Record{typ: recChangeToExclude, group: g})
	}
	return recs
}

// TestHostMcastTableBounded: the table holds MaxMcastGroups host groups;
// joins beyond are refused and counted, sends to new groups dropped and
// counted, and a malformed report changes nothing and is dropped.
func TestHostMcastTableBounded(t *testing.T) {
	ifc, port, _ := mcastPortNode(t, func(c *Config) { c.MaxMcastGroups = 4 })
	var groups []netip.Addr
	for k := range 10 {
		groups = append(groups, netip.AddrFrom4([4]byte{239, 0, 0, byte(k + 1)}))
	}
	// Every report here goes to 224.0.0.22 (buildIGMP), a group the
	// host sends to: a send-only group too when there is room.
	sendOnlyDst := netip.MustParseAddr("224.0.0.22")
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv3(joinRecs(groups...)...))
	// Six joins and the report's own send find no room.
	awaitCond(t, "report handled", func() bool { return ifc.Stats().Reaper.McastTableFull == 7 })
	st := ifc.Stats()
	full := 0
	for _, g := range st.McastGroups {
		if g.State == "full" {
			full++
		}
	}
	if full != 4 || len(st.McastGroups) != 4+3 || ifc.Drop("tx_mcast_table_full") != 1 {
		t.Fatalf("%d full groups of %d, want 4 and the 3 default ones: %+v", full, len(st.McastGroups), st.McastGroups)
	}
	// A send to a new group has no room either.
	other := netip.AddrFrom4([4]byte{239, 0, 0, 99})
	port.in <- rvIPv4(frame.MAC{0x01, 0x00, 0x5e, 0, 0, 99}, frame.MAC(port.mac), [4]byte{10, 0, 0, 1}, other.As4(), 100)
	awaitCond(t, "send dropped", func() bool { return ifc.Drop("tx_mcast_table_full") == 2 })
	// A leave makes room: the leave's own send becomes a send-only group.
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv1v2(igmpV2Leave, groups[0].As4()))
	awaitCond(t, "send-only after the leave", func() bool {
		g, ok := mcastGroupOf(ifc, sendOnlyDst)
		return ok && g.State == "send-only" && slices.Equal(g.Groups, []string{sendOnlyDst.String()})
	})
	if r := ifc.Stats().Reaper; r.McastLeaves != 1 || r.McastSendOnly != 1 {
		t.Fatalf("leaves %d send-only %d, want 1 and 1", r.McastLeaves, r.McastSendOnly)
	}
	// At the limit again, a join evicts the send-only group (and the
	// report's own send finds no room).
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv2(groups[9].As4()))
	awaitCond(t, "join evicts send-only", func() bool { return ifc.Drop("tx_mcast_table_full") == 3 })
	if g, ok := mcastGroupOf(ifc, groups[9]); !ok || g.State != "full" {
		t.Fatalf("joined group %+v (present %v)", g, ok)
	}
	if _, ok := mcastGroupOf(ifc, sendOnlyDst); ok || ifc.Stats().Reaper.McastSendOnlyExpired != 1 {
		t.Fatal("send-only group not evicted for the join")
	}
	// A malformed report (a record count past its end) is dropped whole,
	// though its first record is fine; the next report is handled.
	bad := buildIGMPv3(joinRecs(netip.MustParseAddr("239.9.9.9"))...)
	bad[24+7] = 3
	port.in <- hostFrame(port, frame.EtherTypeIPv4, bad)
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv1v2(igmpV2Leave, groups[1].As4()))
	awaitCond(t, "leave after the bad report", func() bool { return ifc.Stats().Reaper.McastLeaves == 2 })
	if ifc.Drop("tx_bad_mcast_report") != 1 {
		t.Fatalf("tx_bad_mcast_report %d, want 1", ifc.Drop("tx_bad_mcast_report"))
	}
	if _, ok := mcastGroupOf(ifc, netip.MustParseAddr("239.9.9.9")); ok {
		t.Fatal("a record of a malformed report was acted on")
	}
	checkMcastCounts(t, ifc)
}

// TestSyncHostGroups: the host's own list is authoritative (joins what it
// has, leaves what it lacks), except for joins learnt after it was read;
// IPv6 groups sharing an MGID keep it attached until the last leaves.
func TestSyncHostGroups(t *testing.T) {
	ifc, port, dev := mcastPortNode(t, nil)
	// The MGID keeps the low 80 bits of an IPv6 group, not its flags and
	// scope: these two share one.
	a, alias := netip.MustParseAddr("ff15::77"), netip.MustParseAddr("ff05::77")
	b6 := netip.MustParseAddr("239.1.2.3")
	if frame.MulticastMGID(a, 0xFFFF) != frame.MulticastMGID(alias, 0xFFFF) {
		t.Fatal("test groups do not share an MGID")
	}
	read := time.Now()
	if err := ifc.SyncHostGroups([]netip.Addr{a, alias, b6, netip.MustParseAddr("10.0.0.1")}, read); err != nil {
		t.Fatal(err)
	}
	for _, g := range []netip.Addr{a, b6} {
		if gi, ok := mcastGroupOf(ifc, g); !ok || gi.State != "full" || !fabricAttached(dev, g) {
			t.Fatalf("%v after sync: %+v (present %v)", g, gi, ok)
		}
	}
	if gi, _ := mcastGroupOf(ifc, a); len(gi.Groups) != 2 {
		t.Fatalf("shared MGID lists %v, want both groups", gi.Groups)
	}
	// alias left: the MGID stays attached for a.
	if err := ifc.SyncHostGroups([]netip.Addr{a, b6}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if gi, ok := mcastGroupOf(ifc, a); !ok || !slices.Equal(gi.Groups, []string{a.String()}) || !fabricAttached(dev, a) {
		t.Fatalf("after alias left: %+v (present %v)", gi, ok)
	}
	// A join snooped after the next list was read survives that list.
	stale := time.Now()
	late := netip.MustParseAddr("239.5.5.5")
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv2(late.As4()))
	awaitCond(t, "snooped join", func() bool { _, ok := mcastGroupOf(ifc, late); return ok })
	if err := ifc.SyncHostGroups([]netip.Addr{b6}, stale); err != nil {
		t.Fatal(err)
	}
	if _, ok := mcastGroupOf(ifc, late); !ok {
		t.Fatal("a join newer than the list was left")
	}
	if _, ok := mcastGroupOf(ifc, a); ok || fabricAttached(dev, a) {
		t.Fatal("a group missing from the list is still joined")
	}
	// The default groups are never left.
	if err := ifc.SyncHostGroups(nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	st := ifc.Stats()
	var joined []McastGroupInfo
	for _, g := range st.McastGroups {
		if g.State != "send-only" { // the snooped report went to 224.0.0.22
			joined = append(joined, g)
		}
	}
	if len(joined) != 3 {
		t.Fatalf("after an empty list: %+v, want the 3 default groups", st.McastGroups)
	}
	for _, g := range joined {
		if g.State != "default" || !g.Attached {
			t.Fatalf("group %+v", g)
		}
	}
	checkMcastCounts(t, ifc)
	if r := st.Reaper; r.McastLeaves != 3 {
		t.Fatalf("mcast_leaves %d, want 3 (ff15::77, 239.1.2.3, 239.5.5.5)", r.McastLeaves)
	}
}

// attachFailDevice is a soft device whose UD QPs refuse to attach to one
// group while fail is set, as an HCA out of multicast resources does.
type attachFailDevice struct {
	hca.Device
	group hca.GID
	fail  *atomic.Bool
}

func (d attachFailDevice) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	q, err := d.Device.CreateQP(cfg)
	if err != nil || cfg.Type != hca.QPTypeUD {
		return q, err
	}
	return attachFailQP{QP: q, d: d}, nil
}

type attachFailQP struct {
	hca.QP
	d attachFailDevice
}

func (q attachFailQP) AttachMcast(mgid hca.GID) error {
	if mgid == q.d.group && q.d.fail.Load() {
		return fmt.Errorf("attach %s: %w", mgid, hca.ErrQueueFull)
	}
	return q.QP.AttachMcast(mgid)
}

// TestHostMcastJoinErrorRetried: a join the HCA refuses is counted and
// left full but unattached; the host's next report attaches it.
func TestHostMcastJoinErrorRetried(t *testing.T) {
	fab := rvFabric(t, 34)
	sd, err := fab.NewDevice("h1")
	if err != nil {
		t.Fatal(err)
	}
	group := netip.MustParseAddr("239.3.3.3")
	var fail atomic.Bool
	fail.Store(true)
	port := newMemPort(1, nil)
	dev := attachFailDevice{Device: sd, group: frame.MulticastMGID(group, 0xFFFF), fail: &fail}
	ifc, err := New(Config{Device: dev, Host: port, Name: "h1", Mode: ModeConnected, CM: fastCM(), DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ifc.Close() })
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv2(group.As4()))
	awaitCond(t, "refused join", func() bool { return ifc.Stats().Reaper.McastJoinErrors == 1 })
	if g, ok := mcastGroupOf(ifc, group); !ok || g.State != "full" || g.Attached || fabricAttached(sd, group) {
		t.Fatalf("after a refused attach: %+v (present %v)", g, ok)
	}
	fail.Store(false)
	port.in <- hostFrame(port, frame.EtherTypeIPv4, buildIGMPv2(group.As4()))
	awaitCond(t, "retried join", func() bool {
		g, ok := mcastGroupOf(ifc, group)
		return ok && g.Attached && fabricAttached(sd, group)
	})
}
