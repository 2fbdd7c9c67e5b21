package ipoibcm

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// rxState is the life of a passive (receive-only) connection, Linux's
// passive_ids / rx_error / rx_flush / rx_drain / rx_reap lists as states
// (kernel-ipoib.md §4.1).
//
//go:generate go tool stringer -type=rxState -linecomment
type rxState int

const (
	// rxLive: receiving; on the LRU
	rxLive rxState = iota // live
	// rxError: dead, QP in Error, waiting for LAST_WQE (or the flushed ring)
	rxError // error
	// rxFlush: LAST_WQE seen, waiting for a drain WR
	rxFlush // flush
	// rxDrain: covered by the outstanding drain WR
	rxDrain // drain
	// rxReap: drained: the control loop destroys it
	rxReap // reap
	// rxDestroyed: QP and CM id gone
	rxDestroyed // destroyed
)

// rxConn is a passive RC connection (Linux ipoib_cm_rx). The RX poller
// reads dead, stamp and the counters without a lock; everything else is
// owned by the control loop (state also readable under Interface.mu).
type rxConn struct {
	qp      hca.QP
	cmConn  *cm.Conn
	peer    frame.HWAddr
	mac     frame.MAC // the neighbour's MAC, fixed for the neighbour's life
	created time.Time

	// dead is set under the RX poll lock before the QP leaves Live: from
	// then on the poller recycles this connection's completions.
	dead        atomic.Bool
	stamp       atomic.Int64 // LRU: unix nanos of the last refresh
	established atomic.Bool
	packets     atomic.Uint64
	byts        atomic.Uint64

	state rxState

	// Without SRQ: the connection's own ring and how many of its
	// receives are still posted (counted down by flush completions).
	ring       [][]byte
	recvCount  atomic.Int64
	reapPosted atomic.Bool
}

func (rc *rxConn) recvWR(idx int) hca.RecvWR {
	return hca.RecvWR{ID: wrID(wrKindConnRecv, idx), Buf: rc.ring[idx][headroom:]}
}

// acceptREQ is the listener's decision (CM goroutine, must not block):
// create an RC QP whose send and receive CQ are both the RX CQ (the drain
// WR's completion must land behind the receives), receiving from the SRQ
// or its own ring, and answer with {UD QPN, 65524} and a random PSN.
func (i *Interface) acceptREQ(req *cm.Request) cm.Decision {
	if ifState(i.state.Load()) != ifRunning {
		i.rxLimitCtr.rejectedDown.Add(1)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	peerQPN, _, err := parseCMPrivateData(req.PrivateData)
	if err != nil {
		// Linux ignores the REQ's private data; without it we still know
		// the port, and the QPN is only used for display.
		peerQPN = 0
	}
	now := time.Now()
	rc := &rxConn{peer: frame.NewHWAddr(frame.FlagRC, peerQPN, req.RemoteGID), created: now, cmConn: req.Conn}
	rc.stamp.Store(now.UnixNano())

	i.mu.Lock()
	if i.srq == nil && i.nonSRQ >= i.cfg.MaxNonSRQConns {
		i.mu.Unlock()
		i.rs.rxRejectedNoQP.Add(1)
		return cm.Decision{Reject: cm.RejectNoQP}
	}
	// Limits before anything is learnt or created from the REQ.
	old, ok := i.admitRXLocked(rc)
	if !ok {
		i.mu.Unlock()
		return cm.Decision{Reject: cm.RejectNoQP}
	}
	var n *neighbour
	if peerQPN != 0 {
		n = i.learnLocked(rc.peer, netip.Addr{}, now)
	} else if n = i.neigh.byGID[req.RemoteGID]; n == nil {
		n = i.learnLocked(rc.peer, netip.Addr{}, now)
	}
	psn := i.rng.Uint32() & 0xffffff
	if i.srq == nil {
		i.nonSRQ++
	}
	i.mu.Unlock()
	if old != nil {
		i.replaceRX(old)
	}
	if n == nil {
		i.releaseRX(rc)
		return cm.Decision{Reject: cm.RejectConsumerDefined}
	}
	rc.mac = n.mac

	cfg := hca.QPConfig{
		Type:      hca.QPTypeRC,
		SendCQ:    i.rxCQ, // "For drain WR"
		RecvCQ:    i.rxCQ,
		MaxSendWR: 2,
		Context:   rc,
		OnEvent:   func(ev hca.AsyncEvent) { i.onRXQPEvent(rc, ev) },
	}
	if i.srq != nil {
		cfg.SRQ = i.srq.srq
	} else {
		cfg.MaxRecvWR = i.cfg.RecvQueueSize
	}
	qp, err := i.dev.CreateQP(cfg)
	if err != nil {
		i.log.Warn("create RX QP", "peer", rc.peer, "err", err)
		i.releaseRX(rc)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	rc.qp = qp
	if err := i.initRXQP(rc); err != nil {
		i.log.Warn("init RX QP", "peer", rc.peer, "err", err)
		qp.Destroy()
		i.releaseRX(rc)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	if h := i.hooks.rxAccepting; h != nil {
		h(rc)
	}
	// On the live list before the REP leaves: a LAST_WQE that arrives
	// before the CM returns finds the connection (Linux checks state in
	// the REQ handler for the same race). One that arrived earlier may
	// already have taken the connection through drain and destroy: it
	// must not join the set then, where nothing would ever remove it.
	i.mu.Lock()
	if rc.state == rxDestroyed {
		i.mu.Unlock()
		i.rxLimitCtr.rejectedError.Add(1)
		return cm.Decision{Reject: cm.RejectNoQP}
	}
	i.rxConns[rc] = struct{}{}
	i.mu.Unlock()
	i.rs.rxAccepted.Add(1)
	return cm.Decision{
		QP:          qp,
		StartingPSN: psn,
		PrivateData: cmPrivateData(i.ud.qp.QPN()),
		SRQ:         i.srq != nil,
		Handler:     func(ev cm.Event) { i.onRXEvent(rc, ev) },
	}
}

// releaseRX gives back what acceptREQ reserved for a REQ it then
// rejected: the connection slot and, without SRQ, the ring.
func (i *Interface) releaseRX(rc *rxConn) {
	i.rxLimitCtr.rejectedError.Add(1)
	i.mu.Lock()
	i.releaseRXLocked(rc)
	if i.srq == nil {
		i.nonSRQ--
	}
	i.mu.Unlock()
}

// initRXQP moves the QP to Init and, without SRQ, posts its own ring.
func (i *Interface) initRXQP(rc *rxConn) error {
	if err := rc.qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: 0}); err != nil {
		return fmt.Errorf("RX QP to Init: %w", err)
	}
	if i.srq != nil {
		return nil
	}
	rc.ring = make([][]byte, i.cfg.RecvQueueSize)
	wrs := make([]hca.RecvWR, len(rc.ring))
	for k := range rc.ring {
		b, err := i.dev.Alloc(headroom + frame.CMBufSize)
		if err != nil {
			return fmt.Errorf("RX ring buffer %d: %w", k, err)
		}
		rc.ring[k] = b
		wrs[k] = rc.recvWR(k)
	}
	n, err := rc.qp.PostRecv(wrs)
	rc.recvCount.Store(int64(n))
	if err != nil || n != len(wrs) {
		return fmt.Errorf("post %d RX ring receives (%d posted): %w", len(wrs), n, err)
	}
	return nil
}

// onRXEvent runs on the CM goroutine: hand everything to the control loop.
func (i *Interface) onRXEvent(rc *rxConn, ev cm.Event) {
	switch ev.Type {
	case cm.EventEstablished:
		rc.established.Store(true)
	case cm.EventDisconnectRequested, cm.EventRejected, cm.EventStale, cm.EventTimedOut:
		// DREQ and REJ take the teardown path (kernel-ipoib.md §3.5).
		i.ctl.post(func() { i.teardownRX(rc, "cm "+ev.Type.String()) })
	}
}

// onRXQPEvent runs on a backend goroutine, outside its locks.
func (i *Interface) onRXQPEvent(rc *rxConn, ev hca.AsyncEvent) {
	switch ev.Type {
	case hca.EventQPLastWQEReached:
		i.rs.lastWQESeen.Add(1)
		i.ctl.post(func() { i.onLastWQE(rc) })
	case hca.EventQPFatal:
		i.ctl.post(func() { i.teardownRX(rc, "qp fatal") })
	}
}
