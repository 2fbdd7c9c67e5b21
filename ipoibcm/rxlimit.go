package ipoibcm

import (
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
)

// rxLimits is the admission of passive connections: it bounds them, as
// every one costs a QP from the REQ until it is reaped, whether it ever
// carried a packet or not, so an unbounded set is memory a REQ flood can
// take. Connections count from admission (before the QP exists) to
// reapRX, teardown included, so a flood of handshakes that the CM
// abandons cannot outrun the reaper either. Guarded by passiveSet.mu,
// with the connection set; its counters are atomics.
type rxLimits struct {
	count  int
	byGID  map[hca.GID]map[*rxConn]struct{}
	nonSRQ int // admitted connections with their own ring (no SRQ)

	max, maxPerGID, maxNonSRQ int  // Config.MaxRXConns, MaxRXConnsPerGID, MaxNonSRQConns
	ownRings                  bool // no SRQ: every connection has its own ring

	ctr rxAdmitCounters
}

func (l *rxLimits) init(cfg *Config, ownRings bool) {
	l.max, l.maxPerGID, l.maxNonSRQ, l.ownRings = cfg.MaxRXConns, cfg.MaxRXConnsPerGID, cfg.MaxNonSRQConns, ownRings
}

// rxAdmitCounters count what became of the REQs the CM handed to the
// listener: accepted, or why not, so that rx_accepted plus the
// rejections equal the CM's to_listener REQs.
type rxAdmitCounters struct {
	accepted                                  atomic.Uint64
	rejectedLimit, rejectedGIDLimit, replaced atomic.Uint64
	rejectedDown, rejectedError               atomic.Uint64
	// rejectedNoQP: no ring left for a non-SRQ connection;
	// rejectedMTU: the REQ's path MTU is above our port's, refused with
	// REJ INVALID_MTU (cmpathmtu.go).
	rejectedNoQP, rejectedMTU atomic.Uint64
}

// RXLimits is the passive-connection bookkeeping 'ipoib show' reports.
type RXLimits struct {
	// Conns counts passive connections from the REQ's admission until
	// the QP is destroyed (teardown included).
	Conns            int    `json:"rx_conns"`
	MaxConns         int    `json:"max_rx_conns"`
	MaxConnsPerGID   int    `json:"max_rx_conns_per_gid"`
	MaxNonSRQConns   int    `json:"max_non_srq_conns"`
	RejectedLimit    uint64 `json:"rx_rejected_limit"`
	RejectedGIDLimit uint64 `json:"rx_rejected_gid_limit"`
	// Replaced counts established connections torn down to admit a new
	// REQ from the same GID at a limit: the peer restarted.
	Replaced      uint64 `json:"rx_replaced"`
	RejectedDown  uint64 `json:"rx_rejected_down"`
	RejectedError uint64 `json:"rx_rejected_error"`
}

// admitRXLocked reserves a slot for rc. Over MaxRXConns or
// MaxRXConnsPerGID, a GID that holds an established connection still
// gets in: its least recently used established connection is returned
// to be torn down (a restarted peer whose old connection the STALE_CONN
// check did not catch, because its QPN changed). Such replacements need
// a connection that completed a handshake, so a source that cannot
// answer our REPs can never use them, and the set exceeds the limit by
// at most the established connections in teardown. Without SRQ the
// connection also needs one of MaxNonSRQConns rings.
func (l *rxLimits) admitLocked(rc *rxConn) (old *rxConn, ok bool) {
	if l.ownRings && l.nonSRQ >= l.maxNonSRQ {
		l.ctr.rejectedNoQP.Add(1)
		return nil, false
	}
	gid := rc.peer.GID()
	set := l.byGID[gid]
	if l.count >= l.max || len(set) >= l.maxPerGID {
		old = lruEstablished(set)
		if old == nil {
			if l.count >= l.max {
				l.ctr.rejectedLimit.Add(1)
			} else {
				l.ctr.rejectedGIDLimit.Add(1)
			}
			return nil, false
		}
		l.ctr.replaced.Add(1)
	}
	if set == nil {
		set = make(map[*rxConn]struct{})
		if l.byGID == nil {
			l.byGID = make(map[hca.GID]map[*rxConn]struct{})
		}
		l.byGID[gid] = set
	}
	set[rc] = struct{}{}
	l.count++
	if l.ownRings {
		l.nonSRQ++
	}
	return old, true
}

// releaseLocked gives rc's slot (and ring) back. Idempotent.
func (l *rxLimits) releaseLocked(rc *rxConn) {
	gid := rc.peer.GID()
	set := l.byGID[gid]
	if _, ok := set[rc]; !ok {
		return
	}
	delete(set, rc)
	if len(set) == 0 {
		delete(l.byGID, gid)
	}
	l.count--
	if l.ownRings {
		l.nonSRQ--
	}
}

// lruEstablished is the live, established connection of set used least
// recently, or nil. passiveSet.mu held.
func lruEstablished(set map[*rxConn]struct{}) *rxConn {
	var old *rxConn
	for rc := range set {
		if rc.state != rxLive || !rc.established.Load() {
			continue
		}
		if old == nil || rc.stamp.Load() < old.stamp.Load() {
			old = rc
		}
	}
	return old
}

// statsLocked is the admission's part of Stats.
func (l *rxLimits) statsLocked() RXLimits {
	c := &l.ctr
	return RXLimits{
		Conns: l.count, MaxConns: l.max, MaxConnsPerGID: l.maxPerGID, MaxNonSRQConns: l.maxNonSRQ,
		RejectedLimit: c.rejectedLimit.Load(), RejectedGIDLimit: c.rejectedGIDLimit.Load(), Replaced: c.replaced.Load(),
		RejectedDown: c.rejectedDown.Load(), RejectedError: c.rejectedError.Load(),
	}
}
