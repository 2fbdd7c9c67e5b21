package ipoibcm

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// This file is the host's multicast membership on the fabric, as Linux's
// ipoib_multicast.c keeps it: every IP group the host is a member of is a
// full join of its MGID (the UD QP attached, so the fabric delivers the
// group's packets here); a group the host only sends to is a send-only
// join (IPOIB_MCAST_FLAG_SENDONLY: an address handle, never attached),
// collected once the host stops sending to it. Linux learns the host's
// groups from the netdev's multicast list (ipoib_mcast_restart_task); our
// host is a TAP or a gVisor stack, so the engine learns them from the
// IGMP/MLD reports and leaves the host sends, and from the host's own list
// when its owner can read one (SyncHostGroups).

// mcastState is where one MGID stands with the host.
//
//go:generate go tool stringer -type=mcastState -linecomment
type mcastState uint8

const (
	// mcastSendOnly: the host sends to the group but is not a member. The
	// UD QP is not attached; the entry ages out McastSendOnlyTimeout
	// after the last send.
	mcastSendOnly mcastState = iota // send-only
	// mcastFull: the host is a member of at least one IP group that maps
	// to the MGID; the UD QP is attached until it leaves the last.
	mcastFull // full
	// mcastDefault: the broadcast, all-hosts and all-nodes groups every
	// IPoIB interface is in for its whole life (the link is up only
	// after the broadcast join); never left before Close.
	mcastDefault // default
)

// mcastEvent is what happens to a group: the input of mcastStepLocked.
type mcastEvent uint8

const (
	mcastEvJoin  mcastEvent = iota // the host joined an IP group mapping to the MGID
	mcastEvLeave                   // the host left one of them
	mcastEvSend                    // the host sent a packet to the group
	mcastEvIdle                    // the aging pass looks at the group
)

// mcastMember is one IP group of the host that maps to an MGID (IPv6
// groups that differ only in flags and scope share one: the MGID keeps
// their low 80 bits), and when the engine learnt it.
type mcastMember struct {
	group netip.Addr
	at    time.Time
}

// mcastGroup is one MGID the UD QP sends to or receives from.
type mcastGroup struct {
	state    mcastState
	members  []mcastMember
	dst      netip.Addr // last IP destination the host sent to (send-only groups)
	ah       hca.AH
	attached bool
	since    time.Time // created
	lastSend time.Time
}

// mcastTable is the interface's groups, guarded by Interface.mu.
type mcastTable struct {
	groups map[hca.GID]*mcastGroup
	// host counts the groups that are not mcastDefault, which
	// Config.MaxMcastGroups bounds; sendOnly those that are send-only,
	// so a full table without any is refused without a scan.
	host, sendOnly int
	// scratch collects the changes of one IGMP/MLD report (host reader).
	scratch [16]mcastChange

	ctr mcastCounters
}

// mcastCounters count the UD QP's attaches and the groups' changes.
type mcastCounters struct {
	joins, leaves, joinErrors            atomic.Uint64
	sendOnly, sendOnlyExpired, tableFull atomic.Uint64
}

func newMcastTable() mcastTable { return mcastTable{groups: make(map[hca.GID]*mcastGroup)} }

// joinDefaultGroups attaches the broadcast group (the link comes up only
// after it) and the all-hosts / all-nodes groups every IP host is in.
func (i *Interface) joinDefaultGroups() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	now := time.Now()
	for _, g := range []netip.Addr{{}, netip.AddrFrom4([4]byte{224, 0, 0, 1}), netip.MustParseAddr("ff02::1")} {
		mgid := i.bcast
		if g.IsValid() {
			mgid = frame.MulticastMGID(g, i.cfg.PKey)
		}
		mg := i.mcast.groups[mgid]
		switch {
		case mg == nil:
			mg = &mcastGroup{since: now}
			i.mcast.groups[mgid] = mg
		case mg.state != mcastDefault:
			i.mcast.host--
			if mg.state == mcastSendOnly {
				i.mcast.sendOnly--
			}
		}
		mg.state = mcastDefault
		if g.IsValid() && mg.member(g) < 0 {
			mg.members = append(mg.members, mcastMember{group: g, at: now})
		}
		if err := i.attachLocked(mgid, mg); err != nil {
			return fmt.Errorf("join default group %s: %w", mgid, err)
		}
	}
	return nil
}

// mcastStepLocked is the one transition function of a group's state: it
// applies ev for the IP group ip (the member joining or leaving, or the
// destination sent to) to the MGID's entry, creating and removing entries
// and attaching and detaching the UD QP as the state requires. It reports
// false when the table is full and ev would have needed a new entry.
func (i *Interface) mcastStepLocked(mgid hca.GID, ev mcastEvent, ip netip.Addr, now time.Time) bool {
	g := i.mcast.groups[mgid]
	if g == nil {
		switch ev {
		case mcastEvJoin, mcastEvSend:
		default:
			return true // a leave of a group never joined here: nothing to undo
		}
		if i.mcast.host >= i.cfg.MaxMcastGroups && !(ev == mcastEvJoin && i.evictSendOnlyLocked()) {
			i.mcast.ctr.tableFull.Add(1)
			return false
		}
		g = &mcastGroup{state: mcastSendOnly, since: now}
		i.mcast.groups[mgid] = g
		i.mcast.host++
		i.mcast.sendOnly++
		if ev == mcastEvSend {
			g.dst, g.lastSend = ip, now
			i.mcast.ctr.sendOnly.Add(1)
			return true
		}
	}
	switch ev {
	case mcastEvJoin:
		if k := g.member(ip); k >= 0 {
			g.members[k].at = now
		} else {
			g.members = append(g.members, mcastMember{group: ip, at: now})
		}
		if g.state == mcastSendOnly {
			g.state = mcastFull
			i.mcast.sendOnly--
		}
		if err := i.attachLocked(mgid, g); err != nil {
			// The group stays full and unattached; the host's next
			// report or the next list sync tries again.
			i.mcast.ctr.joinErrors.Add(1)
			i.log.Warn("multicast join", "group", ip, "mgid", mgid, "err", err)
		}
	case mcastEvLeave:
		k := g.member(ip)
		if k < 0 {
			return true
		}
		g.members = slices.Delete(g.members, k, k+1)
		if g.state == mcastFull && len(g.members) == 0 {
			i.removeGroupLocked(mgid, g)
			i.mcast.ctr.leaves.Add(1)
		}
	case mcastEvSend:
		g.lastSend = now
		if ip.IsValid() {
			g.dst = ip
		}
	case mcastEvIdle:
		if g.state == mcastSendOnly && now.Sub(g.lastSend) >= i.cfg.McastSendOnlyTimeout {
			i.removeGroupLocked(mgid, g)
			i.mcast.ctr.sendOnlyExpired.Add(1)
		}
	}
	return true
}

func (g *mcastGroup) member(ip netip.Addr) int {
	return slices.IndexFunc(g.members, func(m mcastMember) bool { return m.group == ip })
}

// attachLocked attaches the UD QP to the group once. The soft fabric has
// no SA: attaching is joining; on RoCEv2 it joins the underlay group.
func (i *Interface) attachLocked(mgid hca.GID, g *mcastGroup) error {
	if g.attached || i.hostDown() {
		// While the host has ib0 down a join is only recorded: up
		// attaches it (rejoinGroupsLocked).
		return nil
	}
	if err := i.ud.qp.AttachMcast(mgid); err != nil {
		return fmt.Errorf("attach %s: %w", mgid, err)
	}
	g.attached = true
	i.mcast.ctr.joins.Add(1)
	return nil
}

// removeGroupLocked detaches and forgets a host group. Sends complete
// within PostSend on every backend, so no work request still refers to
// the address handle destroyed here (neighbour eviction relies on the
// same).
func (i *Interface) removeGroupLocked(mgid hca.GID, g *mcastGroup) {
	if g.attached {
		if err := i.ud.qp.DetachMcast(mgid); err != nil {
			i.log.Warn("multicast leave", "mgid", mgid, "err", err)
		}
		g.attached = false
	}
	if g.ah != nil {
		if err := g.ah.Destroy(); err != nil {
			i.log.Warn("destroy multicast AH", "mgid", mgid, "err", err)
		}
		g.ah = nil
	}
	delete(i.mcast.groups, mgid)
	i.mcast.host--
	if g.state == mcastSendOnly {
		i.mcast.sendOnly--
	}
}

// evictSendOnlyLocked makes room for a full join by dropping the send-only
// group sent to least recently: the host's memberships come before its
// sends. It reports false when there is none.
func (i *Interface) evictSendOnlyLocked() bool {
	if i.mcast.sendOnly == 0 {
		return false
	}
	var victim hca.GID
	var vg *mcastGroup
	for mgid, g := range i.mcast.groups {
		if g.state == mcastSendOnly && (vg == nil || g.lastSend.Before(vg.lastSend)) {
			victim, vg = mgid, g
		}
	}
	if vg == nil {
		return false
	}
	i.removeGroupLocked(victim, vg)
	i.mcast.ctr.sendOnlyExpired.Add(1)
	return true
}

// ageMcastLocked collects the send-only groups the host stopped sending to
// (Linux collects them with the neighbours, __ipoib_reap_neigh).
func (i *Interface) ageMcastLocked(now time.Time) {
	if i.mcast.sendOnly == 0 {
		return
	}
	for mgid, g := range i.mcast.groups {
		if g.state == mcastSendOnly {
			i.mcastStepLocked(mgid, mcastEvIdle, netip.Addr{}, now)
		}
	}
}

// hostMcastChangesLocked applies the membership changes of one IGMP/MLD
// message from the host. It reports false for a malformed one: counted,
// and the frame is not sent on.
func (i *Interface) hostMcastReportLocked(etherType uint16, payload []byte, now time.Time) bool {
	changes, v := parseMcastReport(etherType, payload, i.mcast.scratch[:0])
	switch v {
	case mcastBadReport:
		i.ctr.drop(dropTxBadMcastReport)
		return false
	case mcastReport:
		for _, c := range changes {
			i.hostMembershipLocked(c.group, c.join, now)
		}
	}
	return true
}

// hostMembershipLocked is the host joining or leaving IP group a (from a
// report, its list, or the solicited-node group of an address it uses).
func (i *Interface) hostMembershipLocked(a netip.Addr, join bool, now time.Time) {
	if !a.IsMulticast() {
		return
	}
	ev := mcastEvLeave
	if join {
		ev = mcastEvJoin
	}
	i.mcastStepLocked(frame.MulticastMGID(a, i.cfg.PKey), ev, a, now)
}

// mcastAHLocked is the address handle for a host send to mgid (IP
// destination dst, invalid for broadcast), making the group a send-only
// one if the host is not a member. ok is false when the table is full.
func (i *Interface) mcastAHLocked(mgid hca.GID, dst netip.Addr, now time.Time) (hca.AH, bool, error) {
	if !i.mcastStepLocked(mgid, mcastEvSend, dst, now) {
		return nil, false, nil
	}
	g := i.mcast.groups[mgid]
	if g.ah == nil {
		ah, err := i.dev.CreateAH(mgid)
		if err != nil {
			return nil, true, fmt.Errorf("address handle for %s: %w", mgid, err)
		}
		g.ah = ah
	}
	return g.ah, true, nil
}

// SyncHostGroups makes the engine's full joins follow groups, the host's
// own list of its multicast memberships on the interface (read by its
// owner: /proc/net/igmp and /proc/net/igmp6 for a kernel TAP), as Linux's
// ipoib_mcast_restart_task follows the netdev's list: groups in it are
// joined, joined groups absent from it are left. readAt is when the list
// was read: a join the engine learnt from a report after that is newer
// than the list and stays. Entries that are not multicast are ignored.
func (i *Interface) SyncHostGroups(groups []netip.Addr, readAt time.Time) error {
	if ifState(i.state.Load()) != ifRunning {
		return fmt.Errorf("%s: sync host multicast groups: %w", i.cfg.Name, ErrNotStarted)
	}
	want := make(map[netip.Addr]bool, len(groups))
	for _, a := range groups {
		if a = a.Unmap().WithZone(""); a.IsMulticast() {
			want[a] = true
		}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	var gone []netip.Addr
	for _, g := range i.mcast.groups {
		if g.state != mcastFull {
			continue // the default groups stay whatever the list says
		}
		for _, m := range g.members {
			if !want[m.group] && m.at.Before(readAt) {
				gone = append(gone, m.group)
			}
		}
	}
	now := time.Now()
	for _, a := range gone {
		i.hostMembershipLocked(a, false, now)
	}
	for a := range want {
		g := i.mcast.groups[frame.MulticastMGID(a, i.cfg.PKey)]
		if g == nil || g.member(a) < 0 {
			i.hostMembershipLocked(a, true, now)
		}
	}
	return nil
}

// McastGroupInfo is one multicast group in Stats: always every field.
type McastGroupInfo struct {
	MGID string `json:"mgid"`
	// State is "full" (the host is a member: the UD QP is attached),
	// "send-only" (the host sends to it; not attached) or "default" (the
	// broadcast, all-hosts and all-nodes groups, joined for the
	// interface's life).
	State string `json:"state"`
	// Groups are the host's IP groups that map to the MGID; for a
	// send-only group the destination last sent to. The broadcast group
	// has none.
	Groups   []string `json:"groups"`
	Attached bool     `json:"attached"`
	AgeMS    int64    `json:"age_ms"`
	// IdleMS is the time since the host last sent to the group (since it
	// was created if never).
	IdleMS int64 `json:"idle_ms"`
}

// mcastInfoLocked lists the groups, sorted by MGID.
func (i *Interface) mcastInfoLocked(now time.Time) []McastGroupInfo {
	out := make([]McastGroupInfo, 0, len(i.mcast.groups))
	for mgid, g := range i.mcast.groups {
		gi := McastGroupInfo{MGID: mgid.String(), State: g.state.String(), Groups: []string{}, Attached: g.attached,
			AgeMS: millisSince(now, g.since), IdleMS: millisSince(now, g.since)}
		if !g.lastSend.IsZero() {
			gi.IdleMS = millisSince(now, g.lastSend)
		}
		for _, m := range g.members {
			gi.Groups = append(gi.Groups, m.group.String())
		}
		if len(g.members) == 0 && g.dst.IsValid() {
			gi.Groups = append(gi.Groups, g.dst.String())
		}
		out = append(out, gi)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].MGID < out[b].MGID })
	return out
}
