package ipoibcm

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// This file is the active-connection state machine (Linux ipoib_cm_tx):
// every change of txConn.state goes through txTransition, under
// Interface.mu. The route of a connection, top to bottom:
//
//	txConnecting --txEvREP (the REP's private data applied, CM goroutine)-->
//	             the parked frames posted behind it, under the same lock
//	txUp         --txEvTeardown (CM disconnect, send error, idle neighbour,
//	             mode switch, host down, shutdown; from txConnecting too:
//	             REJ, time-out, set-up failure)-->
//	             detached from the neighbour, CM id destroyed, QP to Error
//	txClosing    --txEvDestroy (its last send completed, flushed)-->
//	             out of Interface.txConns, QP destroyed
//	txDestroyed
//
// txEvDestroy also comes from Close's DrainTimeout (forceShutdown), in
// any state. Events that do not fit the state are refused: a duplicate
// teardown, a REP for a connection already closing.

// txState is the life of an active (send-only) connection.
//
//go:generate go tool stringer -type=txState -linecomment
type txState int32

const (
	// txConnecting: REQ sent; frames park on the neighbour
	txConnecting txState = iota // connecting
	// txUp: REP applied (OPER_UP); frames go out
	txUp // up
	// txClosing: QP in Error, waiting for its sends to flush
	txClosing // closing
	// txDestroyed: QP gone, out of Interface.txConns
	txDestroyed // destroyed
)

// txEvent is what happens to an active connection.
//
//go:generate go tool stringer -type=txEvent -linecomment
type txEvent int

const (
	// txEvREP: the REP arrived with usable private data.
	txEvREP txEvent = iota // rep
	// txEvTeardown: the connection is to go (any reason).
	txEvTeardown // teardown
	// txEvDestroy: every send completed (or Close forces it): the QP
	// goes.
	txEvDestroy // destroy
)

// txStep is the transition table: the state ev moves from to, and false
// when ev does not apply to from.
func txStep(from txState, ev txEvent) (txState, bool) {
	switch {
	case ev == txEvREP && from == txConnecting:
		return txUp, true
	case ev == txEvTeardown && (from == txConnecting || from == txUp):
		return txClosing, true
	case ev == txEvDestroy && from != txDestroyed:
		return txDestroyed, true
	}
	return from, false
}

// txStateCell holds a txState. Written only by txTransition (under
// Interface.mu); the TX poller reads it without the lock (sendDone).
type txStateCell struct{ v atomic.Int32 }

func (c *txStateCell) load() txState { return txState(c.v.Load()) }

func (c *txStateCell) store(s txState) { c.v.Store(int32(s)) }

// txConn is an active RC connection to one neighbour (Linux ipoib_cm_tx):
// set up from the control loop, made usable by the REP on the CM
// goroutine, sent on by the host reader, torn down from the control loop
// once its sends flushed.
type txConn struct {
	i      *Interface
	neigh  *neighbour
	peer   frame.HWAddr
	qp     hca.QP
	cmConn *cm.Conn // set by the control loop after Connect

	state   txStateCell // changed only by txTransition
	mtu     int         // peer's receive MTU incl. the IPoIB header
	created time.Time

	outstanding atomic.Int64 // sends posted and not completed
	// teardownPosted latches the data path's request for a teardown, so
	// a burst of failed sends posts one (not state: the teardown itself
	// decides, on the control loop).
	teardownPosted atomic.Bool
	packets, byts  atomic.Uint64
	active         activity     // last send, per host read batch
	reqAt          atomic.Int64 // unix nanos the REQ was sent, for EventTXEstablished
}

// txConnCounters count the active connections' lives.
type txConnCounters struct {
	connects, established, connectFailures atomic.Uint64
	teardowns, destroyed                   atomic.Uint64
	// mtuDowngrades: REQs resent one IB MTU lower after a REJ
	// INVALID_MTU (cmpathmtu.go); forced: destroyed by Close's
	// DrainTimeout with sends still outstanding.
	mtuDowngrades, forced atomic.Uint64
}

// txTransition applies ev to tc (Interface.mu held): the one place
// tc.state changes. It reports whether ev applied; what each change does
// around it is done by its caller, under the same lock where it must be
// atomic with the change.
func (tc *txConn) txTransition(ev txEvent) bool {
	to, ok := txStep(tc.state.load(), ev)
	if ok {
		tc.state.store(to)
	}
	return ok
}

// startTXLocked creates the TX connection of n and hands the REQ to the
// control loop. The frame that triggered it is parked by the caller.
func (i *Interface) startTXLocked(n *neighbour, now time.Time) *txConn {
	tc := &txConn{i: i, neigh: n, peer: n.hw, created: now} // txConnecting
	n.tx = tc
	i.txConns[tc] = struct{}{}
	i.ctl.post(tc.connect)
	return tc
}

// connect creates the RC QP and sends the REQ (control loop).
func (tc *txConn) connect() {
	i := tc.i
	i.mu.Lock()
	live := tc.state.load() == txConnecting && ifState(i.state.Load()) == ifRunning
	i.mu.Unlock()
	if !live {
		tc.teardown()
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
		tc.fail(false)
		return
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: i.pkeyIndex}); err != nil {
		qp.Destroy()
		i.log.Warn("TX QP to Init", "peer", tc.peer, "err", err)
		tc.fail(false)
		return
	}
	// Under mu: Stats reads qp and cmConn (the soak's race run caught it).
	i.mu.Lock()
	tc.qp = qp
	i.mu.Unlock()
	tc.reqAt.Store(time.Now().UnixNano())
	conn, err := i.cmm.Connect(cm.ConnectParams{
		DestGID:     tc.peer.GID(),
		ServiceID:   serviceIDIETF | uint64(tc.peer.QPN()),
		QP:          qp,
		StartingPSN: 0, // Linux sends 0 (FIXME in ipoib_cm_send_req); the REP's PSN is what counts
		PrivateData: cmPrivateData(i.ud.qp.QPN()),
		PathMTU:     i.reqPathMTU(tc.neigh),
		RetryCount:  i.cfg.RCRetry, // what the QPs use goes on the wire
		RNRRetry:    0,             // "RFC draft warns against retries"
		// ipoib_cm_send_req: "arbitrary defaults".
		ResponderResources: 4,
		SRQ:                i.srq != nil,
		PKey:               i.cfg.PKey,
	}, tc.onCMEvent)
	if err != nil {
		i.log.Warn("CM connect", "peer", tc.peer, "err", err)
		tc.fail(true)
		return
	}
	i.mu.Lock()
	tc.cmConn = conn
	i.mu.Unlock()
	i.txc.connects.Add(1)
	i.emitTX(EventTXConnect, tc, 0, "")
}

// onCMEvent runs on the CM goroutine. Only the REP is handled here (it
// must be synchronous: the parked frames leave before the RTU, the 2018
// start_xmit/REP race); everything else goes to the control loop.
func (tc *txConn) onCMEvent(ev cm.Event) {
	i := tc.i
	i.log.Debug("CM TX event", "event", ev.Type, "peer", tc.peer, "reject", ev.RejectReason, "err", ev.Err)
	switch ev.Type {
	case cm.EventREPReceived:
		if !tc.applyREP(ev.PrivateData) {
			ev.Conn.Reject(cm.RejectConsumerDefined)
			i.ctl.post(func() { tc.fail(true) })
		}
	case cm.EventEstablished:
		i.txc.established.Add(1)
		i.emitTX(EventTXEstablished, tc, time.Duration(time.Now().UnixNano()-tc.reqAt.Load()), "")
	case cm.EventRejected, cm.EventTimedOut:
		// A stale-connection REJ is the peer cleaning up after a restart
		// and an unknown service ID means its UD QPN changed (it
		// restarted): neither is a refusal worth backing off for. An
		// unknown service or no answer at all also means our idea of the
		// peer's address may be stale: ask ARP again.
		if ev.Type == cm.EventRejected {
			i.emitTX(EventTXConnectFailed, tc, 0, "REJ "+ev.RejectReason.String())
		} else {
			i.emitTX(EventTXConnectFailed, tc, 0, "no answer")
		}
		stale := ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectStaleConn
		gone := ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectInvalidServiceID
		if ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectInvalidMTU {
			i.ctl.post(func() { tc.fail(!i.lowerPathMTU(tc)) })
			return
		}
		i.ctl.post(func() {
			tc.fail(!stale && !gone)
			if gone || ev.Type == cm.EventTimedOut {
				i.reresolve(tc.neigh)
			}
		})
	case cm.EventDisconnectRequested, cm.EventDisconnected, cm.EventStale, cm.EventTimeWaitExit:
		i.ctl.post(tc.teardown)
	}
}

// applyREP takes the peer's MTU from the REP private data, marks the
// connection up and posts the parked frames, all under Interface.mu so the
// host reader cannot park a frame behind them.
func (tc *txConn) applyREP(pd []byte) bool {
	i := tc.i
	_, mtu, err := parseCMPrivateData(pd)
	if err != nil || mtu <= frame.EncapLen {
		i.log.Warn("REP private data", "peer", tc.peer, "mtu", mtu, "err", err)
		return false
	}
	var replies [][]byte
	i.mu.Lock()
	i.neigh.mu.Lock()
	if !tc.txTransition(txEvREP) {
		i.neigh.mu.Unlock()
		i.mu.Unlock()
		return false
	}
	tc.mtu = min(mtu, frame.CMBufSize)
	n := tc.neigh
	if n.tx != tc {
		i.neigh.mu.Unlock()
		i.mu.Unlock()
		return true
	}
	tx := &i.tx
	p := poster{tx: tx}
	pathMTU := min(tc.mtu-frame.EncapLen, i.MTU())
	for k := range n.nParked {
		pf := n.parked[k]
		b := tx.pool.bufs[pf.buf]
		et := binary.BigEndian.Uint16(b[12:14])
		if pf.n-frame.EthHdrLen > pathMTU {
			// The peer's MTU turned out smaller than the packet: PMTU
			// feedback as on the steady-state path, never a silent drop.
			// Rare (only at connection set-up), so the reply buffer is
			// allocated here rather than kept.
			if reply := i.answerTooBig(make([]byte, replyBufSize), n, b[frame.EthHdrLen:pf.n], pathMTU); reply != nil {
				replies = append(replies, reply)
			}
			tx.pool.put1(pf.buf)
			tx.returnCredits(1)
			continue
		}
		tx.handOverParked()
		if !p.post(sendDest{tc: tc}, pf.buf, pf.n, et, sendOffload{}) {
			// Counted by post; the parked credit is already given up.
			tx.pool.put1(pf.buf)
			tx.wakeIfResumed(tx.outstanding.Load())
		}
	}
	n.unpark(tx)
	i.neigh.mu.Unlock()
	i.mu.Unlock()
	if len(replies) > 0 {
		i.hostOut.write(replies)
	}
	return true
}

// fail ends a connection that could not be set up (control loop); backoff
// sends the neighbour over UD for CMBackoff (a peer advertising 'C' that
// refuses).
func (tc *txConn) fail(backoff bool) {
	i := tc.i
	if backoff {
		i.neigh.mu.Lock()
		if tc.neigh.tx == tc || tc.neigh.tx == nil {
			tc.neigh.cmBackoffUntil = time.Now().Add(i.cfg.CMBackoff)
		}
		i.neigh.mu.Unlock()
		i.txc.connectFailures.Add(1)
	}
	tc.teardown()
}

// sendFailed is the data path's report of a send the connection refused
// or completed in error: teardown, once.
func (tc *txConn) sendFailed() {
	if tc.teardownPosted.CompareAndSwap(false, true) {
		tc.i.ctl.post(tc.teardown)
	}
}

// detachLocked unhooks tc from its neighbour so the next frame starts a
// new connection, dropping frames parked for it (neighbourTable.mu held).
func (tc *txConn) detachLocked(reason dropReason) {
	if tc.neigh.tx == tc {
		tc.neigh.tx = nil
		tc.neigh.dropParked(&tc.i.tx, reason)
	}
}

// teardown moves tc's QP to Error so its posted sends flush, destroys the
// CM id (DREQ when established), and destroys the QP once every send
// completed (control loop). Idempotent.
func (tc *txConn) teardown() {
	i := tc.i
	i.mu.Lock()
	if !tc.txTransition(txEvTeardown) {
		i.mu.Unlock()
		return
	}
	i.neigh.mu.Lock()
	tc.detachLocked(dropTxNeighFlushed)
	i.neigh.mu.Unlock()
	i.mu.Unlock()
	i.txc.teardowns.Add(1)
	i.emitTX(EventTXTeardown, tc, 0, "")
	if tc.cmConn != nil {
		tc.cmConn.Destroy()
	}
	if tc.qp != nil {
		if err := tc.qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
			i.log.Warn("TX QP to Error", "peer", tc.peer, "err", err)
		}
	}
	if tc.outstanding.Load() == 0 {
		tc.destroy()
	}
}

// destroy takes tc out of the connection set and destroys its QP,
// exactly once (control loop).
func (tc *txConn) destroy() {
	i := tc.i
	i.mu.Lock()
	if !tc.txTransition(txEvDestroy) {
		i.mu.Unlock()
		return
	}
	delete(i.txConns, tc)
	i.mu.Unlock()
	if tc.qp != nil {
		if err := tc.qp.Destroy(); err != nil {
			i.log.Warn("destroy TX QP", "peer", tc.peer, "err", err)
		}
	}
	i.txc.destroyed.Add(1)
	i.emitTX(EventTXDestroyed, tc, 0, "")
}

// sendDone accounts one completed send of tc (TX poller); it reports
// whether the send still held a global credit (false after a forced
// destroy returned them all).
func (tc *txConn) sendDone() bool {
	for {
		v := tc.outstanding.Load()
		if v <= 0 {
			return false
		}
		if tc.outstanding.CompareAndSwap(v, v-1) {
			if v == 1 && tc.state.load() >= txClosing {
				tc.i.ctl.post(tc.destroy)
			}
			return true
		}
	}
}
