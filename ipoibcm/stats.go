package ipoibcm

import (
	"net/netip"
	"sort"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/napi"
)

// Counters are the interface counters, named (and JSON-tagged) as Linux's
// `ethtool -S` for ib_ipoib, plus rx_dead_dropped. rx_bytes/tx_bytes count
// IPoIB messages (4-byte header included).
type Counters struct {
	RxPackets     uint64 `json:"rx_packets"`
	TxPackets     uint64 `json:"tx_packets"`
	RxBytes       uint64 `json:"rx_bytes"`
	TxBytes       uint64 `json:"tx_bytes"`
	TxErrors      uint64 `json:"tx_errors"`
	RxDropped     uint64 `json:"rx_dropped"`
	TxDropped     uint64 `json:"tx_dropped"`
	Multicast     uint64 `json:"multicast"`
	RxDeadDropped uint64 `json:"rx_dead_dropped"`
	// RxWrongPKey is the port's count of packets dropped because their
	// P_Key matched no entry of its table or not the receiving QP's
	// (hca.Port.PKeyViolations): the same number on every interface of
	// one device, since a packet of a partition none of them is in
	// belongs to none.
	RxWrongPKey uint64 `json:"rx_wrong_pkey"`
	// RxUDNoBuffer is the port's count of UD datagrams dropped for want
	// of a posted receive (hca.Port.UDNoBuffer): the peers sent faster
	// than this interface reposted its UD ring. Per device, as
	// RxWrongPKey.
	RxUDNoBuffer uint64 `json:"rx_ud_no_buffer"`
}

// NeighbourInfo describes one neighbour. Every field is always present in
// JSON (the schema 'ipoib show --json' promises); durations are integer
// milliseconds, relative to the snapshot.
type NeighbourInfo struct {
	IPs       []netip.Addr `json:"ips"`
	HWAddr    string       `json:"hwaddr"` // colon hex, as ip link prints it
	MAC       string       `json:"mac"`
	Connected bool         `json:"connected"` // the peer advertises 'C'
	TXConn    string       `json:"tx_conn"`   // state of the TX connection, "" if none
	Parked    int          `json:"parked"`
	IdleMS    int64        `json:"idle_ms"`       // since the neighbour was last used
	CMBackoff int64        `json:"cm_backoff_ms"` // left of the CM back-off; 0 when none
}

// ConnInfo describes one RC connection; as NeighbourInfo, every field is
// always present and durations are integer milliseconds.
type ConnInfo struct {
	Peer      string  `json:"peer"` // the peer's hardware address, colon hex
	PeerGID   string  `json:"peer_gid"`
	LocalQPN  hca.QPN `json:"local_qpn"`
	RemoteQPN hca.QPN `json:"remote_qpn"`
	State     string  `json:"state"`
	// MTU is the largest message the connection carries, IPoIB header
	// included: on TX the peer's CM MTU from its REP, on RX the one we
	// advertised in ours (65524).
	MTU   int   `json:"mtu"`
	AgeMS int64 `json:"age_ms"`
	// IdleMS is the time since the connection last carried a packet
	// (sent on TX, received on RX), exact to a poll or read batch; since
	// it was made if it never did.
	IdleMS int64 `json:"idle_ms"`
	// LRUMS (RX only; 0 on TX) is the age of the LRU stamp the stale scan reads:
	// refreshed at most every StaleUpdate (256 s), as Linux's, so it
	// lags real activity by up to that much.
	LRUMS   int64  `json:"lru_ms"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// ReaperStats count the teardown machinery's work.
type ReaperStats struct {
	StaleScans           uint64 `json:"stale_scans"`
	StaleReaped          uint64 `json:"stale_reaped"`
	MovedToError         uint64 `json:"moved_to_error"`
	LastWQESeen          uint64 `json:"last_wqe_seen"`
	LateLastWQE          uint64 `json:"late_last_wqe"` // LAST_WQE on a connection still live
	DrainsPosted         uint64 `json:"drains_posted"`
	DrainsCompleted      uint64 `json:"drains_completed"`
	DrainPostFailures    uint64 `json:"drain_post_failures"`
	Reaped               uint64 `json:"reaped"`
	ForcedAtStop         uint64 `json:"forced_at_stop"`
	CQErrors             uint64 `json:"cq_errors"`
	RXAccepted           uint64 `json:"rx_accepted"`
	RXRejectedNoQP       uint64 `json:"rx_rejected_no_qp"`
	RXRejectedMTU        uint64 `json:"rx_rejected_mtu"`
	TXMTUDowngrades      uint64 `json:"tx_mtu_downgrades"`
	TXConnects           uint64 `json:"tx_connects"`
	TXEstablished        uint64 `json:"tx_established"`
	TXConnectFailures    uint64 `json:"tx_connect_failures"`
	TXTeardowns          uint64 `json:"tx_teardowns"`
	TXDestroyed          uint64 `json:"tx_destroyed"`
	TXQueueStops         uint64 `json:"tx_queue_stops"`
	TXQueueWakes         uint64 `json:"tx_queue_wakes"`
	NeighRestarts        uint64 `json:"neigh_restarts"`
	NeighAged            uint64 `json:"neigh_aged"`
	NeighEvicted         uint64 `json:"neigh_evicted"`
	Reresolves           uint64 `json:"reresolves"`
	ModeSwitches         uint64 `json:"mode_switches"`
	McastJoins           uint64 `json:"mcast_joins"`
	McastLeaves          uint64 `json:"mcast_leaves"`
	McastSendOnly        uint64 `json:"mcast_sendonly"`
	McastSendOnlyExpired uint64 `json:"mcast_sendonly_expired"`
	McastTableFull       uint64 `json:"mcast_table_full"`
	McastJoinErrors      uint64 `json:"mcast_join_errors"`
	TooBigSent           uint64 `json:"too_big_sent"`
	// HostDowns and HostUps count `ip link set ib0 down` / `up` the
	// engine followed; HostDownRXTeardowns, HostDownTXTeardowns and
	// HostDownPathsFlushed the connections the downs tore down and the
	// neighbours whose path (AH, parked frames, CM back-off) they flushed.
	HostDowns            uint64 `json:"host_downs"`
	HostUps              uint64 `json:"host_ups"`
	HostDownRXTeardowns  uint64 `json:"host_down_rx_teardowns"`
	HostDownTXTeardowns  uint64 `json:"host_down_tx_teardowns"`
	HostDownPathsFlushed uint64 `json:"host_down_paths_flushed"`
}

// NAPIStats are the two pollers' statistics.
type NAPIStats struct {
	RX napi.Stats `json:"rx"`
	TX napi.Stats `json:"tx"`
}

// Stats is a snapshot of an Interface.
type Stats struct {
	Name   string `json:"name"`
	Mode   string `json:"mode"`
	MTU    int    `json:"mtu"`
	HWAddr string `json:"hwaddr"`
	LinkUp bool   `json:"link_up"`
	// HostLink is the host's ib0 state as the engine follows it: "up",
	// or "down" after `ip link set ib0 down` (nothing sent, every
	// connection and neighbour gone).
	HostLink    string            `json:"host_link"`
	Counters    Counters          `json:"counters"`
	Drops       map[string]uint64 `json:"drops"`
	Neighbours  []NeighbourInfo   `json:"neighbours"`
	TXConns     []ConnInfo        `json:"tx_conns"`
	RXConns     []ConnInfo        `json:"rx_conns"`
	McastGroups []McastGroupInfo  `json:"mcast_groups"`
	NAPI        NAPIStats         `json:"napi"`
	Reaper      ReaperStats       `json:"reaper"`
	CM          cm.Stats          `json:"cm"`
	RXLimits    RXLimits          `json:"rx_limits"`
	Outstanding int64             `json:"tx_outstanding"`
	SRQPosted   int               `json:"srq_posted"`
	// SRQSize is how many buffers the SRQ owns (posted or in use): it
	// starts at RecvQueueSize and grows under load (srq.go); SRQGrown
	// counts the growths.
	SRQSize  int          `json:"srq_size"`
	SRQGrown uint64       `json:"srq_grown"`
	Offloads OffloadStats `json:"offloads"`
	// Queues is one entry per host queue (one unless the host port is a
	// MultiQueuePort), in queue order.
	Queues []QueueStats `json:"queues"`
}

// QueueStats count one host queue's frames, named as ethtool -S names a
// multi-queue NIC's: tx is what its host reader read from the host (to
// send), rx what was written to the host on it (received). Bytes are
// Ethernet frames' as the host port moved them (a super frame once,
// whole).
type QueueStats struct {
	TxPackets uint64 `json:"tx_packets"`
	TxBytes   uint64 `json:"tx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
	RxBytes   uint64 `json:"rx_bytes"`
}

// Stats returns a snapshot. Counters are read atomically one by one (not
// as a consistent cut); connection lists under the interface lock.
func (i *Interface) Stats() Stats {
	c := &i.ctr
	port := i.dev.Port()
	s := Stats{
		Name:     i.cfg.Name,
		Mode:     i.Mode().String(),
		MTU:      i.MTU(),
		HWAddr:   i.hw.String(),
		LinkUp:   i.LinkUp(),
		HostLink: i.hostLink.load().String(),
		Counters: Counters{
			RxPackets: c.rxPackets.Load(), TxPackets: c.txPackets.Load(),
			RxBytes: c.rxBytes.Load(), TxBytes: c.txBytes.Load(),
			TxErrors: c.txErrors.Load(), RxDropped: c.rxDropped.Load(), TxDropped: c.txDropped.Load(),
			Multicast: c.multicast.Load(), RxDeadDropped: c.rxDeadDropped.Load(),
			RxWrongPKey: port.PKeyViolations, RxUDNoBuffer: port.UDNoBuffer,
		},
		Drops:       make(map[string]uint64),
		NAPI:        NAPIStats{RX: i.rxNAPI.Stats(), TX: i.tx.napi.Stats()},
		Outstanding: i.tx.outstanding.Load(),
		Offloads:    i.off.stats(i.rx.gro),
		Queues:      make([]QueueStats, len(i.queues)),
	}
	for k, q := range i.queues {
		s.Queues[k] = q.stats()
	}
	for _, c := range []interface{ report(*ReaperStats) }{
		&i.passive.reaper.ctr, &i.passive.limits.ctr, &i.active.ctr, &i.tx.ctr, &i.neigh.ctr, &i.mcast.ctr, &i.hostLinkCtr, &i.ifCtr,
	} {
		c.report(&s.Reaper)
	}
	// Every reason, zero included: scripts find each key from the start.
	for r := range numDropReasons {
		s.Drops[r.String()] = c.drops[r].Load()
	}
	if i.cmm != nil {
		s.CM = i.cmm.Stats()
	}
	now := time.Now()
	s.Neighbours, s.TXConns, s.RXConns = []NeighbourInfo{}, []ConnInfo{}, []ConnInfo{}
	s.McastGroups = i.mcast.info(now)
	s.RXLimits, s.RXConns = i.passive.stats(now, s.RXConns)
	if i.srq != nil {
		s.SRQPosted = i.srq.srq.Posted()
		s.SRQSize, s.SRQGrown = int(i.srq.size.Load()), i.srq.grown.Load()
	}
	i.neigh.mu.Lock()
	for _, n := range i.neigh.byGID {
		ni := NeighbourInfo{
			IPs: append([]netip.Addr{}, n.ips...), HWAddr: n.hw.ColonString(), MAC: n.mac.String(),
			Connected: n.hw.Connected(), Parked: n.nParked, IdleMS: millisSince(now, n.lastUse),
			CMBackoff: -millisSince(now, n.cmBackoffUntil),
		}
		if ni.CMBackoff < 0 {
			ni.CMBackoff = 0
		}
		if n.tx != nil {
			ni.TXConn = n.tx.state.load().String()
		}
		s.Neighbours = append(s.Neighbours, ni)
	}
	i.neigh.mu.Unlock()
	s.TXConns = i.active.info(now)
	sort.Slice(s.Neighbours, func(a, b int) bool { return s.Neighbours[a].MAC < s.Neighbours[b].MAC })
	sort.Slice(s.TXConns, func(a, b int) bool { return s.TXConns[a].Peer < s.TXConns[b].Peer })
	sort.Slice(s.RXConns, func(a, b int) bool { return s.RXConns[a].LocalQPN < s.RXConns[b].LocalQPN })
	return s
}

// millisSince is now-t in whole milliseconds; 0 for the zero time.
func millisSince(now, t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return now.Sub(t).Milliseconds()
}

// The owners' counters fill their own fields of the one ReaperStats
// section 'ipoib show' and the metrics have always read.

func (c *reaperCounters) report(s *ReaperStats) {
	s.StaleScans, s.StaleReaped, s.MovedToError = c.staleScans.Load(), c.staleReaped.Load(), c.movedToError.Load()
	s.LastWQESeen, s.LateLastWQE = c.lastWQESeen.Load(), c.lateLastWQE.Load()
	s.DrainsPosted, s.DrainsCompleted, s.DrainPostFailures = c.drainsPosted.Load(), c.drainsCompleted.Load(), c.drainPostFailures.Load()
	s.Reaped = c.reaped.Load()
	s.ForcedAtStop += c.forced.Load()
}

func (c *rxAdmitCounters) report(s *ReaperStats) {
	s.RXAccepted, s.RXRejectedNoQP, s.RXRejectedMTU = c.accepted.Load(), c.rejectedNoQP.Load(), c.rejectedMTU.Load()
}

func (c *txConnCounters) report(s *ReaperStats) {
	s.ForcedAtStop += c.forced.Load()
	s.TXMTUDowngrades, s.TXConnects, s.TXEstablished = c.mtuDowngrades.Load(), c.connects.Load(), c.established.Load()
	s.TXConnectFailures, s.TXTeardowns, s.TXDestroyed = c.connectFailures.Load(), c.teardowns.Load(), c.destroyed.Load()
}

func (c *txPathCounters) report(s *ReaperStats) {
	s.TXQueueStops, s.TXQueueWakes, s.TooBigSent = c.stops.Load(), c.wakes.Load(), c.tooBigSent.Load()
}

func (c *neighCounters) report(s *ReaperStats) {
	s.NeighRestarts, s.NeighAged, s.NeighEvicted, s.Reresolves = c.restarts.Load(), c.aged.Load(), c.evicted.Load(), c.reresolves.Load()
}

func (c *mcastCounters) report(s *ReaperStats) {
	s.McastJoins, s.McastLeaves, s.McastSendOnly = c.joins.Load(), c.leaves.Load(), c.sendOnly.Load()
	s.McastSendOnlyExpired, s.McastTableFull, s.McastJoinErrors = c.sendOnlyExpired.Load(), c.tableFull.Load(), c.joinErrors.Load()
}

func (c *hostLinkCounters) report(s *ReaperStats) {
	s.HostDowns, s.HostUps = c.downs.Load(), c.ups.Load()
	s.HostDownRXTeardowns, s.HostDownTXTeardowns, s.HostDownPathsFlushed = c.downRXTeardowns.Load(), c.downTXTeardowns.Load(), c.downPathsFlushed.Load()
}

func (c *interfaceCounters) report(s *ReaperStats) {
	s.CQErrors, s.ModeSwitches = c.cqErrors.Load(), c.modeSwitches.Load()
}

// Drop returns the count of one named drop reason (0 if unknown).
func (i *Interface) Drop(name string) uint64 {
	for r := range numDropReasons {
		if r.String() == name {
			return i.ctr.drops[r].Load()
		}
	}
	return 0
}
