package ipoibcm

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// This file is the owner of the active connections (Linux ipoib_cm_tx),
// activeSet, and their state machine: every change of txConn.state goes
// through txTransition, under the neighbour table's lock, so a state
// changes together with the neighbour's binding to the connection and its
// parked frames. The route of a connection, top to bottom:
//
//	txConnecting --txEvREP (the REP's private data applied, CM goroutine)-->
//	             the parked frames taken under the same lock, posted after it
//	txUp         --txEvTeardown (CM disconnect, send error, idle neighbour,
//	             mode switch, host down, shutdown; from txConnecting too:
//	             REJ, time-out, set-up failure)-->
//	             detached from the neighbour, CM id destroyed, QP to Error
//	txClosing    --txEvDestroy (its last send completed, flushed)-->
//	             out of the activeSet, QP destroyed
//	txDestroyed
//
// txEvDestroy also comes from Close's DrainTimeout (activeSet.forceAll), in
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
	// txDestroyed: QP gone, out of the activeSet
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
// neighbourTable.mu); the TX poller and the control loop read it without
// the lock.
type txStateCell struct{ v atomic.Int32 }

func (c *txStateCell) load() txState { return txState(c.v.Load()) }

func (c *txStateCell) store(s txState) { c.v.Store(int32(s)) }

// activeSet is the owner of the active connections: the set, their
// set-up over the CM, the REP that makes them usable, their teardown and
// destruction, and their counters. Its lock guards the set and each
// connection's qp and cmConn (Stats and the events read them); a
// connection's state and its neighbour's binding are the neighbour
// table's (txTransition). Lock order: neighbourTable.mu, then this one.
type activeSet struct {
	mu  sync.Mutex
	set map[*txConn]struct{}
	ctr txConnCounters

	// What the owner works with, fixed at New.
	neigh   *neighbourTable
	tx      *txPath
	mcast   *mcastTable // the broadcast group, for the ARP re-probe
	hostOut hostWriters // ICMP answers for parked frames too big for the peer
	dev     hca.Device
	cmm     *cm.Manager
	// sendCQ and recvCQ are the interface's TX and RX CQs.
	sendCQ, recvCQ hca.CQ
	hw             frame.HWAddr // ours
	bcast          hca.GID
	srq            bool
	sendq          int
	retry          uint8 // Config.RCRetry
	pkey           hca.PKey
	backoff        time.Duration // Config.CMBackoff
	// pkeyIndex is the interface's P_Key index (the control loop's, which
	// is where connect reads it); life says whether the interface runs;
	// mtu is its IP MTU now.
	pkeyIndex *int
	life      *ifStateCell
	mtu       *atomic.Int64
	post      func(func()) // onto the control loop
	emitEv    func(kind EventKind, qpn, remote hca.QPN, peer hca.GID, elapsed time.Duration, detail string)
	log       *slog.Logger
}

// init hands the active connections' owner what it works with, from the
// interface being assembled (New); it keeps no pointer to it.
func (a *activeSet) init(i *Interface) {
	a.set = make(map[*txConn]struct{})
	a.neigh, a.tx, a.mcast, a.hostOut = &i.neigh, &i.tx, &i.mcast, i.hostOut
	a.dev, a.cmm, a.sendCQ, a.recvCQ = i.dev, i.cmm, i.txCQ, i.rxCQ
	a.hw, a.bcast, a.srq = i.hw, i.bcast, i.srq != nil
	a.sendq, a.retry, a.pkey, a.backoff = i.cfg.SendQueueSize, i.cfg.RCRetry, i.cfg.PKey, i.cfg.CMBackoff
	a.pkeyIndex, a.life, a.mtu = &i.pkeyIndex, &i.life, &i.mtu
	a.post = i.ctl.post
	a.emitEv = i.obs.emit
	a.log = i.log
}

// txConn is an active RC connection to one neighbour (Linux ipoib_cm_tx):
// set up from the control loop, made usable by the REP on the CM
// goroutine, sent on by the host reader, torn down from the control loop
// once its sends flushed.
type txConn struct {
	set    *activeSet
	neigh  *neighbour
	peer   frame.HWAddr
	qp     hca.QP
	cmConn *cm.Conn // set by the control loop after Connect

	state   txStateCell // changed only by txTransition
	mtu     int         // peer's receive MTU incl. the IPoIB header (neighbourTable.mu)
	created time.Time
	// flushed is open while the REP handler posts the parked frames
	// (neighbourTable.mu): the host reader waits for it to close before
	// it sends on the connection itself, so no frame overtakes them.
	flushed chan struct{}

	// outstanding counts sends posted and not completed, and the send
	// slots reserved for posts about to be made (under
	// neighbourTable.mu, so a teardown sees them).
	outstanding atomic.Int64
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

// txTransition applies ev to tc (neighbourTable.mu held): the one place
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

// startLocked creates the TX connection of n and hands the REQ to the
// control loop (neighbourTable.mu held). The frame that triggered it is
// parked by the caller.
func (s *activeSet) startLocked(n *neighbour, now time.Time) *txConn {
	tc := &txConn{set: s, neigh: n, peer: n.hw, created: now} // txConnecting
	n.tx = tc
	s.mu.Lock()
	s.set[tc] = struct{}{}
	s.mu.Unlock()
	s.post(tc.connect)
	return tc
}

// snapshot copies the set, so callers can tear connections down (which
// removes them from it) while walking the copy.
func (s *activeSet) snapshot() []*txConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := make([]*txConn, 0, len(s.set))
	for tc := range s.set {
		conns = append(conns, tc)
	}
	return conns
}

// count is how many connections the set holds, closing ones included.
func (s *activeSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.set)
}

// info describes every connection for Stats.
func (s *activeSet) info(now time.Time) []ConnInfo {
	s.neigh.mu.Lock()
	defer s.neigh.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ConnInfo, 0, len(s.set))
	for tc := range s.set {
		ci := ConnInfo{
			Peer: tc.peer.ColonString(), PeerGID: tc.peer.GID().String(), State: tc.state.load().String(), MTU: tc.mtu,
			AgeMS: millisSince(now, tc.created), IdleMS: tc.active.idleMS(now, tc.created), Packets: tc.packets.Load(), Bytes: tc.byts.Load(),
		}
		if tc.qp != nil {
			ci.LocalQPN = tc.qp.QPN()
		}
		if tc.cmConn != nil {
			ci.RemoteQPN = tc.cmConn.RemoteQPN()
		}
		out = append(out, ci)
	}
	return out
}

// emit tells the observer of an active connection. Its QP and CM id are
// read under mu: connect sets them while Stats and the CM goroutine may
// look.
func (s *activeSet) emit(kind EventKind, tc *txConn, elapsed time.Duration, detail string) {
	var qpn, remote hca.QPN
	s.mu.Lock()
	if tc.qp != nil {
		qpn = tc.qp.QPN()
	}
	cmConn := tc.cmConn
	s.mu.Unlock()
	if cmConn != nil {
		remote = cmConn.RemoteQPN()
	}
	s.emitEv(kind, qpn, remote, tc.peer.GID(), elapsed, detail)
}

// connect creates the RC QP and sends the REQ (control loop).
func (tc *txConn) connect() {
	s := tc.set
	if tc.state.load() != txConnecting || !s.life.running() {
		tc.teardown()
		return
	}
	qp, err := s.dev.CreateQP(hca.QPConfig{
		Type:      hca.QPTypeRC,
		SendCQ:    s.sendCQ,
		RecvCQ:    s.recvCQ,
		MaxSendWR: s.sendq,
		MaxRecvWR: 1,
		Context:   tc,
		OnEvent:   func(ev hca.AsyncEvent) { s.log.Debug("TX QP event", "event", ev.Type, "qpn", ev.QPN) },
	})
	if err != nil {
		s.log.Warn("create TX QP", "peer", tc.peer, "err", err)
		tc.fail(false)
		return
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: *s.pkeyIndex}); err != nil {
		qp.Destroy()
		s.log.Warn("TX QP to Init", "peer", tc.peer, "err", err)
		tc.fail(false)
		return
	}
	// Under mu: Stats reads qp and cmConn (the soak's race run caught it).
	s.mu.Lock()
	tc.qp = qp
	s.mu.Unlock()
	tc.reqAt.Store(time.Now().UnixNano())
	conn, err := s.cmm.Connect(cm.ConnectParams{
		DestGID:     tc.peer.GID(),
		ServiceID:   serviceIDIETF | uint64(tc.peer.QPN()),
		QP:          qp,
		StartingPSN: 0, // Linux sends 0 (FIXME in ipoib_cm_send_req); the REP's PSN is what counts
		PrivateData: cmPrivateData(s.hw.QPN()),
		PathMTU:     s.neigh.reqPathMTU(tc.neigh),
		RetryCount:  s.retry, // what the QPs use goes on the wire
		RNRRetry:    0,       // "RFC draft warns against retries"
		// ipoib_cm_send_req: "arbitrary defaults".
		ResponderResources: 4,
		SRQ:                s.srq,
		PKey:               s.pkey,
	}, tc.onCMEvent)
	if err != nil {
		s.log.Warn("CM connect", "peer", tc.peer, "err", err)
		tc.fail(true)
		return
	}
	s.mu.Lock()
	tc.cmConn = conn
	s.mu.Unlock()
	s.ctr.connects.Add(1)
	s.emit(EventTXConnect, tc, 0, "")
}

// onCMEvent runs on the CM goroutine. Only the REP is handled here (it
// must be synchronous: the parked frames leave before the RTU, the 2018
// start_xmit/REP race); everything else goes to the control loop.
func (tc *txConn) onCMEvent(ev cm.Event) {
	s := tc.set
	s.log.Debug("CM TX event", "event", ev.Type, "peer", tc.peer, "reject", ev.RejectReason, "err", ev.Err)
	switch ev.Type {
	case cm.EventREPReceived:
		if !tc.applyREP(ev.PrivateData) {
			ev.Conn.Reject(cm.RejectConsumerDefined)
			s.post(func() { tc.fail(true) })
		}
	case cm.EventEstablished:
		s.ctr.established.Add(1)
		s.emit(EventTXEstablished, tc, time.Duration(time.Now().UnixNano()-tc.reqAt.Load()), "")
	case cm.EventRejected, cm.EventTimedOut:
		// A stale-connection REJ is the peer cleaning up after a restart
		// and an unknown service ID means its UD QPN changed (it
		// restarted): neither is a refusal worth backing off for. An
		// unknown service or no answer at all also means our idea of the
		// peer's address may be stale: ask ARP again.
		if ev.Type == cm.EventRejected {
			s.emit(EventTXConnectFailed, tc, 0, "REJ "+ev.RejectReason.String())
		} else {
			s.emit(EventTXConnectFailed, tc, 0, "no answer")
		}
		stale := ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectStaleConn
		gone := ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectInvalidServiceID
		if ev.Type == cm.EventRejected && ev.RejectReason == cm.RejectInvalidMTU {
			s.post(func() { tc.fail(!s.lowerPathMTU(tc)) })
			return
		}
		s.post(func() {
			tc.fail(!stale && !gone)
			if gone || ev.Type == cm.EventTimedOut {
				s.reresolve(tc.neigh)
			}
		})
	case cm.EventDisconnectRequested, cm.EventDisconnected, cm.EventStale, cm.EventTimeWaitExit:
		s.post(tc.teardown)
	}
}

// applyREP takes the peer's MTU from the REP private data, marks the
// connection up and posts the parked frames, in order, before any frame
// the host reader sends on it later. The state change and taking the
// parked frames happen under the neighbour table's lock, so the reader
// cannot park a frame behind them; the posts come after it, and a reader
// that meanwhile has a frame for the connection waits until they are out
// (flushed): at most maxParked posts, once per connection, as it waited
// for the lock before.
func (tc *txConn) applyREP(pd []byte) bool {
	s := tc.set
	_, mtu, err := parseCMPrivateData(pd)
	if err != nil || mtu <= frame.EncapLen {
		s.log.Warn("REP private data", "peer", tc.peer, "mtu", mtu, "err", err)
		return false
	}
	tx := s.tx
	var parked [maxParked]parkedFrame
	s.neigh.mu.Lock()
	if !tc.txTransition(txEvREP) {
		s.neigh.mu.Unlock()
		return false
	}
	tc.mtu = min(mtu, frame.CMBufSize)
	n := tc.neigh
	if n.tx != tc {
		s.neigh.mu.Unlock()
		return true
	}
	cnt := copy(parked[:], n.parked[:n.nParked])
	n.unpark(tx)
	// Their send slots, reserved under the lock as the reader reserves:
	// a teardown from now on leaves the destroy to their completions.
	tc.outstanding.Add(int64(cnt))
	if cnt > 0 {
		tc.flushed = make(chan struct{})
	}
	pathMTU := min(tc.mtu-frame.EncapLen, int(s.mtu.Load()))
	s.neigh.mu.Unlock()

	var replies [][]byte
	p := poster{tx: tx}
	for _, pf := range parked[:cnt] {
		b := tx.pool.bufs[pf.buf]
		if pf.n-frame.EthHdrLen > pathMTU {
			// The peer's MTU turned out smaller than the packet: PMTU
			// feedback as on the steady-state path, never a silent drop.
			// Rare (only at connection set-up), so the reply buffer is
			// allocated here rather than kept.
			if reply := tx.answerTooBig(make([]byte, replyBufSize), n, b[frame.EthHdrLen:pf.n], pathMTU); reply != nil {
				replies = append(replies, reply)
			}
			tx.pool.put1(pf.buf)
			tx.returnCredits(1)
			tc.sendDone()
			continue
		}
		tc.postHandedOver(&p, pf)
	}
	if cnt > 0 {
		s.neigh.mu.Lock()
		close(tc.flushed)
		tc.flushed = nil
		s.neigh.mu.Unlock()
	}
	if len(replies) > 0 {
		s.hostOut.writeReplies(replies)
	}
	return true
}

// postHandedOver posts a parked frame, whose TX credit it hands to the
// send and whose send slot the caller reserved.
func (tc *txConn) postHandedOver(p *poster, pf parkedFrame) {
	tx := tc.set.tx
	et := binary.BigEndian.Uint16(tx.pool.bufs[pf.buf][12:14])
	tx.handOverParked()
	if !p.post(sendDest{tc: tc}, pf.buf, pf.n, et, sendOffload{}) {
		// Counted by post; the credit is already given up.
		tx.pool.put1(pf.buf)
		tx.wakeIfResumed(tx.outstanding.Load())
	}
}

// fail ends a connection that could not be set up (control loop); backoff
// sends the neighbour over UD for CMBackoff (a peer advertising 'C' that
// refuses).
func (tc *txConn) fail(backoff bool) {
	s := tc.set
	if backoff {
		s.neigh.mu.Lock()
		if tc.neigh.tx == tc || tc.neigh.tx == nil {
			tc.neigh.cmBackoffUntil = time.Now().Add(s.backoff)
		}
		s.neigh.mu.Unlock()
		s.ctr.connectFailures.Add(1)
	}
	tc.teardown()
}

// sendFailed is the data path's report of a send the connection refused
// or completed in error: teardown, once.
func (tc *txConn) sendFailed() {
	if tc.teardownPosted.CompareAndSwap(false, true) {
		tc.set.post(tc.teardown)
	}
}

// detachLocked unhooks tc from its neighbour so the next frame starts a
// new connection, dropping frames parked for it (neighbourTable.mu held).
func (tc *txConn) detachLocked(reason dropReason) {
	if tc.neigh.tx == tc {
		tc.neigh.tx = nil
		tc.neigh.dropParked(tc.set.tx, reason)
	}
}

// teardown moves tc's QP to Error so its posted sends flush, destroys the
// CM id (DREQ when established), and destroys the QP once every send
// completed (control loop). Idempotent.
func (tc *txConn) teardown() {
	s := tc.set
	s.neigh.mu.Lock()
	if !tc.txTransition(txEvTeardown) {
		s.neigh.mu.Unlock()
		return
	}
	tc.detachLocked(dropTxNeighFlushed)
	s.neigh.mu.Unlock()
	s.ctr.teardowns.Add(1)
	s.emit(EventTXTeardown, tc, 0, "")
	s.mu.Lock()
	cmConn, qp := tc.cmConn, tc.qp
	s.mu.Unlock()
	if cmConn != nil {
		cmConn.Destroy()
	}
	if qp != nil {
		if err := qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
			s.log.Warn("TX QP to Error", "peer", tc.peer, "err", err)
		}
	}
	// After the state change (under the lock the reader reserves under):
	// a post reserved before it is counted here, and its completion
	// destroys.
	if tc.outstanding.Load() == 0 {
		tc.destroy()
	}
}

// destroy takes tc out of the connection set and destroys its QP,
// exactly once (control loop).
func (tc *txConn) destroy() {
	s := tc.set
	s.neigh.mu.Lock()
	ok := tc.txTransition(txEvDestroy)
	s.neigh.mu.Unlock()
	if !ok {
		return
	}
	s.mu.Lock()
	delete(s.set, tc)
	qp := tc.qp
	s.mu.Unlock()
	if qp != nil {
		if err := qp.Destroy(); err != nil {
			s.log.Warn("destroy TX QP", "peer", tc.peer, "err", err)
		}
	}
	s.ctr.destroyed.Add(1)
	s.emit(EventTXDestroyed, tc, 0, "")
}

// sendDone accounts one completed send of tc, or a reserved slot given
// back unposted; it reports whether the send still held a global credit
// (false after a forced destroy returned them all). The last one of a
// closing connection destroys it.
func (tc *txConn) sendDone() bool {
	for {
		v := tc.outstanding.Load()
		if v <= 0 {
			return false
		}
		if tc.outstanding.CompareAndSwap(v, v-1) {
			if v == 1 && tc.state.load() >= txClosing {
				tc.set.post(tc.destroy)
			}
			return true
		}
	}
}

// lowerPathMTU takes a REJ INVALID_MTU for tc: the next REQ to its peer
// goes one IB MTU lower. It reports false when there is nothing lower to
// try (the peer then gets the usual CM back-off). Control loop.
func (s *activeSet) lowerPathMTU(tc *txConn) bool {
	cur := s.neigh.reqPathMTU(tc.neigh)
	if cur <= hca.MTU256 {
		return false
	}
	lower := cur / 2
	s.neigh.mu.Lock()
	tc.neigh.pathMTU = lower
	s.neigh.mu.Unlock()
	s.ctr.mtuDowngrades.Add(1)
	s.log.Info("peer refused our CM path MTU; the next REQ asks for less", "peer", tc.peer, "path_mtu", cur, "next", lower)
	return true
}

// reresolve asks ARP again for a neighbour's IPv4 addresses, from the
// engine itself (sender = our hardware address and a host address), so a
// peer that came back with a new UD QPN is relearnt without waiting for
// the host's ARP cache to expire. The reply also reaches the host, which
// takes it as a confirmation. Control loop.
func (s *activeSet) reresolve(n *neighbour) {
	var src netip.Addr
	s.neigh.mu.Lock()
	for _, a := range s.neigh.hostIPs {
		if a.Is4() {
			src = a
			break
		}
	}
	ips := slices.Clone(n.ips)
	s.neigh.mu.Unlock()
	if !src.IsValid() {
		return
	}
	tx := s.tx
	p := poster{tx: tx}
	for _, ip := range ips {
		if !ip.Is4() || tx.creditsFree() < 2 {
			continue
		}
		var idx [1]int
		if tx.pool.take(idx[:]) == 0 {
			return
		}
		b := tx.pool.bufs[idx[0]]
		req := frame.IPoIBARP{ARP: frame.ARP{Op: arpOpRequest, SenderIP: src, TargetIP: ip}, SenderHW: s.hw}
		size := frame.EthHdrLen + req.Marshal(b[frame.EthHdrLen:])
		// The broadcast group is a default group: its address handle
		// lives until Close.
		ah, _, err := s.mcast.ah(s.bcast, netip.Addr{}, time.Now())
		if err != nil || !p.post(sendDest{ah: ah, qpn: hca.QPNMulticast}, idx[0], size, frame.EtherTypeARP, sendOffload{}) {
			tx.pool.put1(idx[0])
			return
		}
		s.neigh.ctr.reresolves.Add(1)
	}
}

// teardownAll starts every connection's teardown (control loop: Close,
// the host's link down, a departed P_Key) and says how many there were.
func (s *activeSet) teardownAll() int {
	conns := s.snapshot()
	for _, tc := range conns {
		tc.teardown()
	}
	return len(conns)
}

// forceAll destroys every connection left (Close's DrainTimeout ran out)
// and says how many there were.
func (s *activeSet) forceAll() int {
	conns := s.snapshot()
	for _, tc := range conns {
		// Return the credits its unflushed sends hold; late completions
		// then find outstanding at zero and return none.
		if v := tc.outstanding.Swap(0); v > 0 {
			s.tx.returnCredits(int(v))
		}
		s.ctr.forced.Add(1)
		tc.destroy()
	}
	return len(conns)
}
