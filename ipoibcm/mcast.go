package ipoibcm

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
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

// mcastEvent is what happens to a group: the input of stepLocked.
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

// mcastTable is the interface's groups: their states, the UD QP's
// attachments and the groups' address handles. mu guards the table. The
// host reader posts to the handles mcastTable.ah returns after releasing
// mu, so a removed group's handle is retired (sendWindow, txpath.go) and
// destroyed once the reader's batch is over. Lock order: Interface.mu,
// the passive set's, the neighbour table's, then mu; nothing of the
// table calls out to the Interface.
type mcastTable struct {
	mu     sync.Mutex
	groups map[hca.GID]*mcastGroup
	// host counts the groups that are not mcastDefault, which
	// Config.MaxMcastGroups bounds; sendOnly those that are send-only,
	// so a full table without any is refused without a scan.
	host, sendOnly int
	// scratch collects the changes of one IGMP/MLD report (host reader).
	scratch [16]mcastChange

	ctr mcastCounters

	// What the table works with, fixed at New (qp once the UD QP exists).
	qp              mcastAttacher
	ahs             ahMaker
	pkey            hca.PKey
	bcast           hca.GID
	max             int           // Config.MaxMcastGroups
	sendOnlyTimeout time.Duration // Config.McastSendOnlyTimeout
	hostDown        func() bool   // joins are only recorded while the host has ib0 down
	retire          func(hca.AH)  // destroys an address handle once no send can use it (sendWindow)
	log             *slog.Logger
}

// mcastAttacher is what the table needs of the UD QP.
type mcastAttacher interface {
	AttachMcast(mgid hca.GID) error
	DetachMcast(mgid hca.GID) error
}

// ahMaker makes address handles (the device).
type ahMaker interface {
	CreateAH(dgid hca.GID) (hca.AH, error)
}

// mcastCounters count the UD QP's attaches and the groups' changes.
type mcastCounters struct {
	joins, leaves, joinErrors            atomic.Uint64
	sendOnly, sendOnlyExpired, tableFull atomic.Uint64
}

// init readies the table of an interface in partition pkey.
func (m *mcastTable) init(cfg *Config, ahs ahMaker, bcast hca.GID, hostDown func() bool, log *slog.Logger) {
	m.groups = make(map[hca.GID]*mcastGroup)
	m.ahs, m.pkey, m.bcast, m.hostDown, m.log = ahs, cfg.PKey, bcast, hostDown, log
	m.max, m.sendOnlyTimeout = cfg.MaxMcastGroups, cfg.McastSendOnlyTimeout
}

// joinDefaults attaches the broadcast group (the link comes up only
// after it) and the all-hosts / all-nodes groups every IP host is in.
func (m *mcastTable) joinDefaults(now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range []netip.Addr{{}, netip.AddrFrom4([4]byte{224, 0, 0, 1}), netip.MustParseAddr("ff02::1")} {
		mgid := m.bcast
		if g.IsValid() {
			mgid = frame.MulticastMGID(g, m.pkey)
		}
		mg := m.groups[mgid]
		switch {
		case mg == nil:
			mg = &mcastGroup{since: now}
			m.groups[mgid] = mg
		case mg.state != mcastDefault:
			m.host--
			if mg.state == mcastSendOnly {
				m.sendOnly--
			}
		}
		mg.state = mcastDefault
		if g.IsValid() && mg.member(g) < 0 {
			mg.members = append(mg.members, mcastMember{group: g, at: now})
		}
		if err := m.attachLocked(mgid, mg); err != nil {
			return fmt.Errorf("join default group %s: %w", mgid, err)
		}
	}
	return nil
}

// stepLocked is the one transition function of a group's state: it
// applies ev for the IP group ip (the member joining or leaving, or the
// destination sent to) to the MGID's entry, creating and removing entries
// and attaching and detaching the UD QP as the state requires. It reports
// false when the table is full and ev would have needed a new entry. mu
// held.
func (m *mcastTable) stepLocked(mgid hca.GID, ev mcastEvent, ip netip.Addr, now time.Time) bool {
	g := m.groups[mgid]
	if g == nil {
		switch ev {
		case mcastEvJoin, mcastEvSend:
		default:
			return true // a leave of a group never joined here: nothing to undo
		}
		if m.host >= m.max && !(ev == mcastEvJoin && m.evictSendOnlyLocked()) {
			m.ctr.tableFull.Add(1)
			return false
		}
		g = &mcastGroup{state: mcastSendOnly, since: now}
		m.groups[mgid] = g
		m.host++
		m.sendOnly++
		if ev == mcastEvSend {
			g.dst, g.lastSend = ip, now
			m.ctr.sendOnly.Add(1)
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
			m.sendOnly--
		}
		if err := m.attachLocked(mgid, g); err != nil {
			// The group stays full and unattached; the host's next
			// report or the next list sync tries again.
			m.ctr.joinErrors.Add(1)
			m.log.Warn("multicast join", "group", ip, "mgid", mgid, "err", err)
		}
	case mcastEvLeave:
		k := g.member(ip)
		if k < 0 {
			return true
		}
		g.members = slices.Delete(g.members, k, k+1)
		if g.state == mcastFull && len(g.members) == 0 {
			// Counted before the detach, so whoever sees the group
			// gone from the fabric sees the leave counted.
			m.ctr.leaves.Add(1)
			m.removeLocked(mgid, g)
		}
	case mcastEvSend:
		g.lastSend = now
		if ip.IsValid() {
			g.dst = ip
		}
	case mcastEvIdle:
		if g.state == mcastSendOnly && now.Sub(g.lastSend) >= m.sendOnlyTimeout {
			m.removeLocked(mgid, g)
			m.ctr.sendOnlyExpired.Add(1)
		}
	}
	return true
}

func (g *mcastGroup) member(ip netip.Addr) int {
	return slices.IndexFunc(g.members, func(mb mcastMember) bool { return mb.group == ip })
}

// attachLocked attaches the UD QP to the group once. The soft fabric has
// no SA: attaching is joining; on RoCEv2 it joins the underlay group.
func (m *mcastTable) attachLocked(mgid hca.GID, g *mcastGroup) error {
	if g.attached || m.hostDown() {
		// While the host has ib0 down a join is only recorded: up
		// attaches it (rejoin).
		return nil
	}
	if err := m.qp.AttachMcast(mgid); err != nil {
		return fmt.Errorf("attach %s: %w", mgid, err)
	}
	g.attached = true
	m.ctr.joins.Add(1)
	return nil
}

// removeLocked detaches and forgets a host group. Its address handle is
// retired: the host reader may still be posting with it (sendWindow).
func (m *mcastTable) removeLocked(mgid hca.GID, g *mcastGroup) {
	if g.attached {
		if err := m.qp.DetachMcast(mgid); err != nil {
			m.log.Warn("multicast leave", "mgid", mgid, "err", err)
		}
		g.attached = false
	}
	if g.ah != nil {
		m.retire(g.ah)
		g.ah = nil
	}
	delete(m.groups, mgid)
	m.host--
	if g.state == mcastSendOnly {
		m.sendOnly--
	}
}

// evictSendOnlyLocked makes room for a full join by dropping the send-only
// group sent to least recently: the host's memberships come before its
// sends. It reports false when there is none.
func (m *mcastTable) evictSendOnlyLocked() bool {
	if m.sendOnly == 0 {
		return false
	}
	var victim hca.GID
	var vg *mcastGroup
	for mgid, g := range m.groups {
		if g.state == mcastSendOnly && (vg == nil || g.lastSend.Before(vg.lastSend)) {
			victim, vg = mgid, g
		}
	}
	if vg == nil {
		return false
	}
	m.removeLocked(victim, vg)
	m.ctr.sendOnlyExpired.Add(1)
	return true
}

// age collects the send-only groups the host stopped sending to (Linux
// collects them with the neighbours, __ipoib_reap_neigh).
func (m *mcastTable) age(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sendOnly == 0 {
		return
	}
	for mgid, g := range m.groups {
		if g.state == mcastSendOnly {
			m.stepLocked(mgid, mcastEvIdle, netip.Addr{}, now)
		}
	}
}

// hostReport applies the membership changes of one IGMP/MLD message from
// the host (mayBeMcastReport said it may be one). mcastBadReport: the
// message is malformed, nothing of it applied; the caller counts it and
// does not send it on.
func (m *mcastTable) hostReport(etherType uint16, payload []byte, now time.Time) mcastVerdict {
	m.mu.Lock()
	defer m.mu.Unlock()
	changes, v := parseMcastReport(etherType, payload, m.scratch[:0])
	if v == mcastReport {
		for _, c := range changes {
			m.membershipLocked(c.group, c.join, now)
		}
	}
	return v
}

// membership is the host joining or leaving IP group a (from a report,
// its list, or the solicited-node group of an address it uses).
func (m *mcastTable) membership(a netip.Addr, join bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.membershipLocked(a, join, now)
}

func (m *mcastTable) membershipLocked(a netip.Addr, join bool, now time.Time) {
	if !a.IsMulticast() {
		return
	}
	ev := mcastEvLeave
	if join {
		ev = mcastEvJoin
	}
	m.stepLocked(frame.MulticastMGID(a, m.pkey), ev, a, now)
}

// ah is the address handle for a host send to mgid (IP destination dst,
// invalid for broadcast), making the group a send-only one if the host is
// not a member. ok is false when the table is full.
func (m *mcastTable) ah(mgid hca.GID, dst netip.Addr, now time.Time) (hca.AH, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.stepLocked(mgid, mcastEvSend, dst, now) {
		return nil, false, nil
	}
	g := m.groups[mgid]
	if g.ah == nil {
		ah, err := m.ahs.CreateAH(mgid)
		if err != nil {
			return nil, true, fmt.Errorf("address handle for %s: %w", mgid, err)
		}
		g.ah = ah
	}
	return g.ah, true, nil
}

// leaveAll detaches the UD QP from every group it is attached to, as
// ipoib_mcast_dev_flush does. The entries stay, with their state and
// members: the host is still a member of its IP groups, and rejoin
// attaches them again. It returns how many it detached.
func (m *mcastTable) leaveAll() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for mgid, g := range m.groups {
		if !g.attached {
			continue
		}
		if err := m.qp.DetachMcast(mgid); err != nil {
			m.log.Warn("leave multicast group", "mgid", mgid, "err", err)
			continue
		}
		g.attached = false
		n++
	}
	return n
}

// rejoin attaches every group the host is a member of again: the default
// groups (broadcast, all-hosts, all-nodes) and its full joins, including
// those learnt while down.
func (m *mcastTable) rejoin() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var first error
	for mgid, g := range m.groups {
		if g.state == mcastSendOnly {
			continue
		}
		if err := m.attachLocked(mgid, g); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// destroy detaches the UD QP from every group and destroys the groups'
// address handles (Close, New's clean-up).
func (m *mcastTable) destroy() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for mgid, g := range m.groups {
		if g.attached && m.qp != nil {
			if err := m.qp.DetachMcast(mgid); err != nil {
				m.log.Warn("detach multicast", "mgid", mgid, "err", err)
			}
			g.attached = false
		}
		if g.ah != nil {
			g.ah.Destroy()
			g.ah = nil
		}
	}
}

// SyncHostGroups makes the engine's full joins follow groups, the host's
// own list of its multicast memberships on the interface (read by its
// owner: /proc/net/igmp and /proc/net/igmp6 for a kernel TAP), as Linux's
// ipoib_mcast_restart_task follows the netdev's list: groups in it are
// joined, joined groups absent from it are left. readAt is when the list
// was read: a join the engine learnt from a report after that is newer
// than the list and stays. Entries that are not multicast are ignored.
func (i *Interface) SyncHostGroups(groups []netip.Addr, readAt time.Time) error {
	if !i.life.running() {
		return fmt.Errorf("%s: sync host multicast groups: %w", i.cfg.Name, ErrNotStarted)
	}
	want := make(map[netip.Addr]bool, len(groups))
	for _, a := range groups {
		if a = a.Unmap().WithZone(""); a.IsMulticast() {
			want[a] = true
		}
	}
	i.mcast.sync(want, readAt)
	return nil
}

// sync is SyncHostGroups on the table: want is the host's list, read at
// readAt.
func (m *mcastTable) sync(want map[netip.Addr]bool, readAt time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var gone []netip.Addr
	for _, g := range m.groups {
		if g.state != mcastFull {
			continue // the default groups stay whatever the list says
		}
		for _, mb := range g.members {
			if !want[mb.group] && mb.at.Before(readAt) {
				gone = append(gone, mb.group)
			}
		}
	}
	now := time.Now()
	for _, a := range gone {
		m.membershipLocked(a, false, now)
	}
	for a := range want {
		g := m.groups[frame.MulticastMGID(a, m.pkey)]
		if g == nil || g.member(a) < 0 {
			m.membershipLocked(a, true, now)
		}
	}
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

// info lists the groups, sorted by MGID.
func (m *mcastTable) info(now time.Time) []McastGroupInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]McastGroupInfo, 0, len(m.groups))
	for mgid, g := range m.groups {
		gi := McastGroupInfo{MGID: mgid.String(), State: g.state.String(), Groups: []string{}, Attached: g.attached,
			AgeMS: millisSince(now, g.since), IdleMS: millisSince(now, g.since)}
		if !g.lastSend.IsZero() {
			gi.IdleMS = millisSince(now, g.lastSend)
		}
		for _, mb := range g.members {
			gi.Groups = append(gi.Groups, mb.group.String())
		}
		if len(g.members) == 0 && g.dst.IsValid() {
			gi.Groups = append(gi.Groups, g.dst.String())
		}
		out = append(out, gi)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].MGID < out[b].MGID })
	return out
}
