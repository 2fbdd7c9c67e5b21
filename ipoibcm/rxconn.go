package ipoibcm

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// rxConn is a passive RC connection (Linux ipoib_cm_rx): accepted on the
// CM goroutine, received on by the RX poller, and taken through its state
// machine (rxteardown.go) on the control loop. The RX poller reads dead,
// stamp and the counters without a lock; state is changed only by
// rxTransition (readable under passiveSet.mu).
type rxConn struct {
	// events takes the connection's CM and QP events to its state
	// machine; lastWQE counts the LAST_WQE_REACHED events it saw.
	events  rxEventSink
	lastWQE *atomic.Uint64
	log     *slog.Logger

	qp      hca.QP
	cmConn  *cm.Conn
	peer    frame.HWAddr
	mac     frame.MAC // the neighbour's MAC, fixed for the neighbour's life
	created time.Time
	// deadAt is when the dead flag was set (control loop), the start of
	// the passive teardown time EventReaped reports.
	deadAt time.Time

	// dead is set under the RX poll lock before the QP leaves Live: from
	// then on the poller recycles this connection's completions.
	dead        atomic.Bool
	stamp       atomic.Int64 // LRU: unix nanos of the last refresh
	active      activity     // last receive, per poll batch
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

// rxEventSink is where a passive connection's events go: the state
// machine on the control loop (postRX never blocks).
type rxEventSink interface {
	postRX(rc *rxConn, ev rxEvent)
}

func (rc *rxConn) recvWR(idx int) hca.RecvWR {
	return hca.RecvWR{ID: wrID(wrKindConnRecv, idx), Buf: rc.ring[idx][headroom:]}
}

// info is the connection as 'ipoib show' lists it (passiveSet.mu held:
// state).
func (rc *rxConn) info(now time.Time) ConnInfo {
	ci := ConnInfo{
		Peer: rc.peer.ColonString(), PeerGID: rc.peer.GID().String(), LocalQPN: rc.qp.QPN(), State: rc.state.String(),
		MTU: frame.CMBufSize, AgeMS: millisSince(now, rc.created), IdleMS: rc.active.idleMS(now, rc.created),
		LRUMS:   millisSince(now, time.Unix(0, rc.stamp.Load())),
		Packets: rc.packets.Load(), Bytes: rc.byts.Load(),
	}
	if rc.cmConn != nil {
		ci.RemoteQPN = rc.cmConn.RemoteQPN()
	}
	return ci
}

// decideREQ is acceptREQ, with the outcome told to the EventObserver.
func (p *passiveSet) decideREQ(req *cm.Request) cm.Decision {
	d := p.acceptREQ(req)
	if p.obs.on() {
		if d.Reject != 0 {
			p.obs.emit(EventRXRejected, 0, 0, req.RemoteGID, 0, "REJ "+d.Reject.String())
		} else {
			p.obs.emit(EventRXAccepted, d.QP.QPN(), 0, req.RemoteGID, 0, "")
		}
	}
	return d
}

// acceptREQ is the listener's decision (CM goroutine, must not block):
// create an RC QP whose send and receive CQ are both the RX CQ (the drain
// WR's completion must land behind the receives), receiving from the SRQ
// or its own ring, and answer with {UD QPN, 65524} and a random PSN.
func (p *passiveSet) acceptREQ(req *cm.Request) cm.Decision {
	p.log.Debug("CM REQ", "from", req.RemoteGID, "qpn", req.RemoteQPN, "path_mtu", req.PathMTU)
	if !p.life.running() || p.hostLink.down() {
		p.limits.ctr.rejectedDown.Add(1)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	if req.PathMTU > p.portMTU {
		return p.rejectPathMTU(req)
	}
	peerQPN, _, err := parseCMPrivateData(req.PrivateData)
	if err != nil {
		// Linux ignores the REQ's private data; without it we still know
		// the port, and the QPN is only used for display.
		peerQPN = 0
	}
	now := time.Now()
	rc := &rxConn{events: p, lastWQE: &p.reaper.ctr.lastWQESeen, log: p.log,
		peer: frame.NewHWAddr(frame.FlagRC, peerQPN, req.RemoteGID), created: now, cmConn: req.Conn}
	rc.stamp.Store(now.UnixNano())

	p.mu.Lock()
	// Limits before anything is learnt or created from the REQ.
	old, ok := p.limits.admitLocked(rc)
	if !ok {
		p.mu.Unlock()
		return cm.Decision{Reject: cm.RejectNoQP}
	}
	var n *neighbour
	p.neigh.mu.Lock()
	if peerQPN != 0 {
		n = p.neigh.learn(rc.peer, netip.Addr{}, now)
	} else if n = p.neigh.lookupGID(req.RemoteGID); n == nil {
		n = p.neigh.learn(rc.peer, netip.Addr{}, now)
	}
	p.neigh.mu.Unlock()
	psn := p.psn.next()
	p.mu.Unlock()
	if old != nil {
		p.postRX(old, rxEvReplaced)
	}
	if n == nil {
		p.release(rc, &p.limits.ctr.rejectedError)
		return cm.Decision{Reject: cm.RejectConsumerDefined}
	}
	rc.mac = n.mac

	cfg := hca.QPConfig{
		Type:      hca.QPTypeRC,
		SendCQ:    p.cq, // "For drain WR"
		RecvCQ:    p.cq,
		MaxSendWR: 2,
		Context:   rc,
		OnEvent:   rc.onQPEvent,
	}
	if p.srq != nil {
		cfg.SRQ = p.srq.srq
	} else {
		cfg.MaxRecvWR = p.recvq
	}
	qp, err := p.dev.CreateQP(cfg)
	if err != nil {
		p.log.Warn("create RX QP", "peer", rc.peer, "err", err)
		p.release(rc, &p.limits.ctr.rejectedError)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	rc.qp = qp
	if err := p.initRXQP(rc, req.PKeyIndex); err != nil {
		p.log.Warn("init RX QP", "peer", rc.peer, "err", err)
		qp.Destroy()
		p.release(rc, &p.limits.ctr.rejectedError)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	// On the live list before the REP leaves: a LAST_WQE that arrives
	// before the CM returns finds the connection (Linux checks state in
	// the REQ handler for the same race). One that arrived earlier may
	// already have taken the connection through drain and destroy: it
	// must not join the set then, where nothing would ever remove it.
	p.mu.Lock()
	if rc.state == rxDestroyed {
		p.mu.Unlock()
		p.limits.ctr.rejectedError.Add(1)
		return cm.Decision{Reject: cm.RejectNoQP}
	}
	if p.hostLink.down() {
		// The host set ib0 down after the check above, and stopForHost's
		// snapshot of the set (taken after it set the host link down
		// under mu) cannot have seen this one: refuse it here.
		p.mu.Unlock()
		if err := qp.Destroy(); err != nil {
			p.log.Warn("destroy RX QP", "peer", rc.peer, "err", err)
		}
		p.release(rc, &p.limits.ctr.rejectedDown)
		return cm.Decision{Reject: cm.RejectNoResources}
	}
	p.set[rc] = struct{}{}
	p.mu.Unlock()
	p.limits.ctr.accepted.Add(1)
	return cm.Decision{
		QP:          qp,
		StartingPSN: psn,
		PrivateData: cmPrivateData(p.udQPN),
		SRQ:         p.srq != nil,
		Handler:     rc.onCMEvent,
	}
}

// initRXQP moves the QP to Init on the P_Key index the REQ's partition
// has here (the CM checked it is the interface's) and, without SRQ, posts
// its own ring.
func (p *passiveSet) initRXQP(rc *rxConn, pkeyIndex int) error {
	if err := rc.qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: pkeyIndex}); err != nil {
		return fmt.Errorf("RX QP to Init: %w", err)
	}
	if p.srq != nil {
		return nil
	}
	rc.ring = make([][]byte, p.recvq)
	wrs := make([]hca.RecvWR, len(rc.ring))
	for k := range rc.ring {
		b, err := p.dev.Alloc(headroom + frame.CMBufSize)
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

// onCMEvent runs on the CM goroutine: everything but the RTU becomes an
// event of the connection's state machine, on the control loop.
func (rc *rxConn) onCMEvent(ev cm.Event) {
	rc.log.Debug("CM RX event", "event", ev.Type, "peer", rc.peer, "reject", ev.RejectReason, "err", ev.Err)
	switch ev.Type {
	case cm.EventEstablished:
		rc.established.Store(true)
	case cm.EventDisconnectRequested, cm.EventRejected, cm.EventStale, cm.EventTimedOut:
		// DREQ and REJ take the teardown path (docs/linux.md §3.5).
		rc.events.postRX(rc, rxEvDisconnected)
	}
}

// onQPEvent runs on a backend goroutine, outside its locks.
func (rc *rxConn) onQPEvent(ev hca.AsyncEvent) {
	switch ev.Type {
	case hca.EventQPLastWQEReached:
		rc.lastWQE.Add(1)
		rc.events.postRX(rc, rxEvLastWQE)
	case hca.EventQPFatal:
		rc.events.postRX(rc, rxEvQPFatal)
	}
}
