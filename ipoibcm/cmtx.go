package ipoibcm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// Service IDs (wire-formats.md §2): Linux/OFED's IETF base, which we
// connect to, and the RFC 4755 form illumos uses, which we also accept.
const (
	serviceIDIETF uint64 = 0x1000000000000000
	serviceIDRFC  uint64 = 0x0100000000000000
)

// cmPrivateData is struct ipoib_cm_data: {UD QPN, receive MTU}, big-endian.
func cmPrivateData(qpn hca.QPN) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b[0:4], uint32(qpn&hca.QPNMask))
	binary.BigEndian.PutUint32(b[4:8], frame.CMBufSize)
	return b
}

// parseCMPrivateData reads {UD QPN, MTU}; the QPN's high byte is ignored
// on receive (RFC 4755 §6).
func parseCMPrivateData(b []byte) (hca.QPN, int, error) {
	if len(b) < 8 {
		return 0, 0, fmt.Errorf("CM private data of %d bytes: %w", len(b), hca.ErrInvalidArgument)
	}
	return hca.QPN(binary.BigEndian.Uint32(b[0:4])) & hca.QPNMask, int(binary.BigEndian.Uint32(b[4:8])), nil
}

// txState is the life of an active (send-only) connection.
//
//go:generate go tool stringer -type=txState -linecomment
type txState int

const (
	// txConnecting: REQ sent; frames park on the neighbour
	txConnecting txState = iota // connecting
	// txUp: REP applied (OPER_UP); frames go out
	txUp // up
	// txClosing: QP in Error, waiting for its sends to flush
	txClosing   // closing
	txDestroyed // destroyed
)

// txConn is an active RC connection to one neighbour (Linux ipoib_cm_tx).
type txConn struct {
	neigh  *neighbour
	peer   frame.HWAddr
	qp     hca.QP
	cmConn *cm.Conn // set by the control loop after Connect

	state   txState // guarded by Interface.mu
	mtu     int     // peer's receive MTU incl. the IPoIB header
	created time.Time

	outstanding   atomic.Int64 // sends posted and not completed
	closing       atomic.Bool  // teardown began: flush completions expected
	failed        atomic.Bool  // teardown requested once
	destroyClaim  atomic.Bool  // whoever wins destroys the QP
	packets, byts atomic.Uint64
}

// startTXLocked creates the TX connection of n and hands the REQ to the
// control loop. The frame that triggered it is parked by the caller.
func (i *Interface) startTXLocked(n *neighbour, now time.Time) *txConn {
	tc := &txConn{neigh: n, peer: n.hw, state: txConnecting, created: now}
	n.tx = tc
	i.txConns[tc] = struct{}{}
	i.ctl.post(func() { i.connectTX(tc) })
	return tc
}

// connectTX creates the RC QP and sends the REQ (control loop).
func (i *Interface) connectTX(tc *txConn) {
	i.mu.Lock()
	live := tc.state == txConnecting && ifState(i.state.Load()) == ifRunning
	i.mu.Unlock()
	if !live {
		i.teardownTX(tc)
		return
	}
	qp, err := i.dev.CreateQP(hca.QPConfig{
		Type:      hca.QPTypeRC,
		SendCQ:    i.txCQ,
		RecvCQ:    i.rxCQ,
		MaxSendWR: i.cfg.SendQueueSize,
		MaxRecvWR: 1,
		Context:   tc,
		OnEvent:   func(ev hca.AsyncEvent) { i.log.Debug("TX QP event", "event", ev.Type, "qpn", ev.QPN) },
	})
	if err != nil {
		i.log.Warn("create TX QP", "peer", tc.peer, "err", err)
		i.failTX(tc, false)
		return
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: 0}); err != nil {
		qp.Destroy()
		i.log.Warn("TX QP to Init", "peer", tc.peer, "err", err)
		i.failTX(tc, false)
		return
	}
	// Under mu: Stats reads qp and cmConn (the soak's race run caught it).
	i.mu.Lock()
	tc.qp = qp
	i.mu.Unlock()
	conn, err := i.cmm.Connect(cm.ConnectParams{
		DestGID:     tc.peer.GID(),
		ServiceID:   serviceIDIETF | uint64(tc.peer.QPN()),
		QP:          qp,
		StartingPSN: 0, // Linux sends 0 (FIXME in ipoib_cm_send_req); the REP's PSN is what counts
		PrivateData: cmPrivateData(i.ud.qp.QPN()),
		PathMTU:     i.port.ActiveMTU,
		RetryCount:  i.cfg.RCRetry, // what the QPs use goes on the wire
		RNRRetry:    0,             // "RFC draft warns against retries"
		// ipoib_cm_send_req: "arbitrary defaults".
		ResponderResources: 4,
		SRQ:                i.srq != nil,
	}, func(ev cm.Event) { i.onTXEvent(tc, ev) })
	if err != nil {
		i.log.Warn("CM connect", "peer", tc.peer, "err", err)
		i.failTX(tc, true)
		return
	}
	i.mu.Lock()
	tc.cmConn = conn
	i.mu.Unlock()
	i.rs.txConnects.Add(1)
}

// onTXEvent runs on the CM goroutine. Only the REP is handled here (it
// must be synchronous: the parked frames leave before the RTU, the 2018
// start_xmit/REP race); everything else goes to the control loop.
func (i *Interface) onTXEvent(tc *txConn, ev cm.Event) {
	switch ev.Type {
	case cm.EventREPReceived:
		if h := i.hooks.repReceived; h != nil {
			h(tc)
		}
		if !i.applyREP(tc, ev.PrivateData) {
			ev.Conn.Reject(cm.RejectConsumerDefined)
			i.ctl.post(func() { i.failTX(tc, true) })
		}
	case cm.EventEstablished:
		i.rs.txEstablished.Add(1)
	case cm.EventRejected, cm.EventTimedOut:
		// A stale-connection REJ is the peer cleaning up after a restart
		// and an unknown service ID means its UD QPN changed (it
		// restarted): neither is a refusal worth backing off for. An
		// unknown service or no answer at all also means our idea of the
		// peer's address may be stale: ask ARP again.
		stale := ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectStaleConn
		gone := ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectInvalidServiceID
		i.ctl.post(func() {
			i.failTX(tc, !stale && !gone)
			if gone || ev.Type == cm.EventTimedOut {
				i.reresolve(tc.neigh)
			}
		})
	case cm.EventDisconnectRequested, cm.EventDisconnected, cm.EventStale, cm.EventTimeWaitExit:
		i.ctl.post(func() { i.teardownTX(tc) })
	}
}

// applyREP takes the peer's MTU from the REP private data, marks the
// connection up and posts the parked frames, all under Interface.mu so the
// host reader cannot park a frame behind them.
func (i *Interface) applyREP(tc *txConn, pd []byte) bool {
	_, mtu, err := parseCMPrivateData(pd)
	if err != nil || mtu <= frame.EncapLen {
		i.log.Warn("REP private data", "peer", tc.peer, "mtu", mtu, "err", err)
		return false
	}
	var replies [][]byte
	i.mu.Lock()
	if tc.state != txConnecting {
		i.mu.Unlock()
		return false
	}
	tc.mtu = min(mtu, frame.CMBufSize)
	tc.state = txUp
	n := tc.neigh
	if n.tx != tc {
		i.mu.Unlock()
		return true
	}
	if h := i.hooks.repApplying; h != nil {
		h(tc)
	}
	var wr [1]hca.SendWR
	pathMTU := min(tc.mtu-frame.EncapLen, i.MTU())
	for k := range n.nParked {
		p := n.parked[k]
		b := i.pool.bufs[p.buf]
		et := binary.BigEndian.Uint16(b[12:14])
		switch {
		case p.n-frame.EthHdrLen > pathMTU:
			// The peer's MTU turned out smaller than the packet: PMTU
			// feedback as on the steady-state path, never a silent drop.
			// Rare (only at connection set-up), so the reply buffer is
			// allocated here rather than kept.
			if reply := i.answerTooBig(make([]byte, replyBufSize), n, b[frame.EthHdrLen:p.n], pathMTU); reply != nil {
				replies = append(replies, reply)
			}
		case i.postConnLocked(&wr, tc, p.buf, p.n, et):
			continue // its parked credit is now the send's
		}
		// Dropped; postConnLocked counted a failed post itself.
		i.pool.put1(p.buf)
		i.returnCredits(1)
	}
	i.unparkLocked(n)
	i.mu.Unlock()
	if len(replies) > 0 {
		i.writeHost(replies)
	}
	return true
}

// failTX ends a connection that could not be set up; backoff sends the
// neighbour over UD for CMBackoff (a peer advertising 'C' that refuses).
func (i *Interface) failTX(tc *txConn, backoff bool) {
	if backoff {
		i.mu.Lock()
		if tc.neigh.tx == tc || tc.neigh.tx == nil {
			tc.neigh.cmBackoffUntil = time.Now().Add(i.cfg.CMBackoff)
		}
		i.mu.Unlock()
		i.rs.txConnectFailures.Add(1)
	}
	i.teardownTX(tc)
}

// txConnFailed is called from the data path (send error): teardown once.
func (i *Interface) txConnFailed(tc *txConn) {
	if tc.failed.CompareAndSwap(false, true) {
		i.ctl.post(func() { i.teardownTX(tc) })
	}
}

// detachTXLocked unhooks tc from its neighbour so the next frame starts a
// new connection, dropping frames parked for it.
func (i *Interface) detachTXLocked(tc *txConn, reason dropReason) {
	if tc.neigh.tx == tc {
		tc.neigh.tx = nil
		i.dropParkedLocked(tc.neigh, reason)
	}
}

// teardownTX moves tc's QP to Error so its posted sends flush, destroys
// the CM id (DREQ when established), and destroys the QP once every send
// completed (control loop). Idempotent.
func (i *Interface) teardownTX(tc *txConn) {
	i.mu.Lock()
	if tc.state == txClosing || tc.state == txDestroyed {
		i.mu.Unlock()
		return
	}
	tc.state = txClosing
	tc.closing.Store(true)
	i.detachTXLocked(tc, dropTxNeighFlushed)
	i.mu.Unlock()
	i.rs.txTeardowns.Add(1)
	if tc.cmConn != nil {
		tc.cmConn.Destroy()
	}
	if tc.qp != nil {
		if err := tc.qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
			i.log.Warn("TX QP to Error", "peer", tc.peer, "err", err)
		}
	}
	if tc.outstanding.Load() == 0 {
		i.destroyTX(tc)
	}
}

// destroyTX destroys tc's QP exactly once (control loop).
func (i *Interface) destroyTX(tc *txConn) {
	if !tc.destroyClaim.CompareAndSwap(false, true) {
		return
	}
	if tc.qp != nil {
		if err := tc.qp.Destroy(); err != nil {
			i.log.Warn("destroy TX QP", "peer", tc.peer, "err", err)
		}
	}
	i.mu.Lock()
	tc.state = txDestroyed
	delete(i.txConns, tc)
	i.mu.Unlock()
	i.rs.txDestroyed.Add(1)
	if h := i.hooks.txDestroyed; h != nil {
		h(tc)
	}
}

// txSendDone accounts one completed send of tc; it reports whether the
// send still held a global credit (false after a forced destroy returned
// them all).
func (i *Interface) txSendDone(tc *txConn) bool {
	for {
		v := tc.outstanding.Load()
		if v <= 0 {
			return false
		}
		if tc.outstanding.CompareAndSwap(v, v-1) {
			if v == 1 && tc.closing.Load() {
				i.ctl.post(func() { i.destroyTX(tc) })
			}
			return true
		}
	}
}
