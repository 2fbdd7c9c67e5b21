package rocev2

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/internal/core"
)

// timerKind says what a QP's single timer is waiting for.
//
//go:generate go tool stringer -type=timerKind -linecomment
type timerKind uint8

const (
	timerNone timerKind = iota // none
	// timerRetry: the transport (local ACK) timeout.
	timerRetry // retry
	// timerRNR: the RNR NAK delay before resending.
	timerRNR // rnr
)

// sendWQE is a posted RC send. Its PSNs are fixed at post time, so
// go-back-N can find the packet any PSN stands for.
type sendWQE struct {
	id       uint64
	data     []byte
	firstPSN uint32
	npkts    uint32
	// zcGen is the last work batch that sent part of data without
	// copying it (Device.workGen); its completion waits for that batch.
	zcGen uint64
}

// qp is a queue pair; every field but destroyed is guarded by dev.mu.
type qp struct {
	dev *Device
	qpn hca.QPN
	// retransmits counts the packets this QP sent again (dev.mu held);
	// the device's total is Stats.Retransmits.
	retransmits uint64
	typ         hca.QPType
	cfg         hca.QPConfig
	sendCQ      *cq
	recvCQ      *cq
	srq         *srq
	state       hca.QPState
	// destroyed is written under dev.mu and read by Poll, which takes
	// only the CQ lock.
	destroyed atomic.Bool
	qkey      hca.QKey
	// pkeyIndex is the QP's index in the port's P_Key table: it holds an
	// index, not a value, so a rewritten table moves it (IBTA 10.9).
	pkeyIndex int
	mcast     core.Attachments
	// lastWQESent makes EventQPLastWQEReached fire once per QP.
	lastWQESent bool
	// src is the socket the QP's packets leave from (its UDP source
	// port, see sourcePorts).
	src *udpSocket

	rq core.Queue[hca.RecvWR] // own receive queue (non-SRQ)

	udPSN uint32
	// zcGen is the last work batch that sent any of the QP's send
	// buffers without copying them (Device.awaitTx).
	zcGen uint64

	// RC requester.
	sq            []sendWQE
	sqHead, sqLen int
	dest          netip.Addr
	destQPN       hca.QPN
	mtu           int
	timeout       time.Duration // scaled; 0 = none
	retryCount    uint8
	rnrRetry      uint8
	retryLeft     uint8
	rnrLeft       uint8
	nextPSN       uint32 // first PSN of the next posted WQE
	una           uint32 // oldest unacknowledged PSN
	txPSN         uint32 // next PSN to transmit
	sentEnd       uint32 // one past the highest PSN transmitted
	txIdx, txOff  int    // WQE (from sqHead) and byte offset of txPSN
	timer         timerKind
	deadline      time.Time

	// RC responder.
	minRNR     uint8
	ePSN       uint32
	msn        uint32
	nakSent    bool
	inMsg      bool
	cur        hca.RecvWR
	curValid   bool
	curOff     int
	ackPending bool
	ackPSN     uint32
}

var _ hca.QP = (*qp)(nil)

// CreateQP implements hca.Device.
func (d *Device) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	sc, ok1 := cfg.SendCQ.(*cq)
	rc, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || sc.dev != d || rc.dev != d {
		return nil, fmt.Errorf("rocev2: create QP: CQs not of this device: %w", hca.ErrInvalidArgument)
	}
	var s *srq
	if cfg.SRQ != nil {
		var ok bool
		if s, ok = cfg.SRQ.(*srq); !ok || s.dev != d {
			return nil, fmt.Errorf("rocev2: create QP: SRQ not of this device: %w", hca.ErrInvalidArgument)
		}
		if cfg.Type != hca.QPTypeRC {
			return nil, fmt.Errorf("rocev2: create %s QP with SRQ: %w", cfg.Type, hca.ErrNotSupported)
		}
	}
	if cfg.MaxSendWR < 0 || cfg.MaxSendWR > maxQPWR || cfg.MaxRecvWR < 0 || cfg.MaxRecvWR > maxQPWR {
		return nil, fmt.Errorf("rocev2: create QP: WR limits %d/%d: %w", cfg.MaxSendWR, cfg.MaxRecvWR, hca.ErrInvalidArgument)
	}
	q := &qp{dev: d, typ: cfg.Type, cfg: cfg, sendCQ: sc, recvCQ: rc, srq: s}
	switch cfg.Type {
	case hca.QPTypeRC:
		q.sq = make([]sendWQE, max(cfg.MaxSendWR, 1))
	case hca.QPTypeUD, hca.QPTypeGSI:
	default:
		return nil, fmt.Errorf("rocev2: create QP type %v: %w", cfg.Type, hca.ErrInvalidArgument)
	}
	if s == nil {
		q.rq = core.NewQueue[hca.RecvWR](max(cfg.MaxRecvWR, 1))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("rocev2: create QP: %w", hca.ErrDestroyed)
	}
	if sc.destroyed || rc.destroyed || s != nil && s.destroyed {
		return nil, fmt.Errorf("rocev2: create QP on destroyed CQ/SRQ: %w", hca.ErrDestroyed)
	}
	if cfg.Type == hca.QPTypeGSI {
		if d.gsi != nil {
			return nil, fmt.Errorf("rocev2: GSI QP exists: %w", hca.ErrBusy)
		}
		q.qpn, q.qkey = hca.QPNGSI, hca.QKeyGSI
		d.gsi = q
	} else {
		if len(d.qps) >= maxQP {
			return nil, fmt.Errorf("rocev2: create QP: %w", hca.ErrNoResources)
		}
		for {
			n := d.nextQPN
			d.nextQPN++
			if d.nextQPN >= hca.QPNMask {
				d.nextQPN = firstQPN
			}
			if _, used := d.qps[n]; !used {
				q.qpn = n
				break
			}
		}
	}
	d.qps[q.qpn] = q
	q.src = d.sock // an RC QP sends nothing before RTR names its peer
	if q.typ != hca.QPTypeRC {
		q.src = d.srcPorts.acquire(sourcePortOf(q), &d.ctr)
	}
	sc.refs++
	rc.refs++
	if s != nil {
		s.refs++
	}
	return q, nil
}

func (q *qp) QPN() hca.QPN     { return q.qpn }
func (q *qp) Type() hca.QPType { return q.typ }

func (q *qp) State() hca.QPState {
	q.dev.mu.Lock()
	defer q.dev.mu.Unlock()
	return q.state
}

func (q *qp) Modify(a hca.QPAttr) error {
	d := q.dev
	// A reset gives the send buffers back: wait for a transmit still
	// reading them, after unlocking (deferred calls run last in first).
	var txWait uint64
	defer func() { d.awaitTx(txWait) }()
	d.mu.Lock()
	defer d.unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("modify")
	}
	if err := hca.CheckTransition(q.typ, q.state, a.State); err != nil {
		return fmt.Errorf("rocev2: modify QP %#x: %w", q.qpn, err)
	}
	switch a.State {
	case hca.QPStateInit:
		if a.PKeyIndex < 0 || a.PKeyIndex >= len(d.pkeys) {
			return fmt.Errorf("rocev2: P_Key index %d of %d: %w", a.PKeyIndex, len(d.pkeys), hca.ErrInvalidArgument)
		}
		q.pkeyIndex = a.PKeyIndex
		if q.typ == hca.QPTypeUD {
			q.qkey = a.QKey
		}
	case hca.QPStateRTR:
		if q.typ == hca.QPTypeRC {
			mtu := a.PathMTU
			if mtu == 0 {
				mtu = d.cfg.MTU
			}
			if !mtu.Valid() {
				return fmt.Errorf("rocev2: path MTU %d: %w", a.PathMTU, hca.ErrInvalidArgument)
			}
			dest := a.DestGID.Addr()
			if dest.Is4() != d.local.Addr().Is4() || a.DestGID.IsMulticast() {
				return fmt.Errorf("rocev2: RC dest GID %v: %w", a.DestGID, hca.ErrInvalidArgument)
			}
			q.mtu = int(min(mtu, d.cfg.MTU))
			q.dest, q.destQPN = dest, a.DestQPN&hca.QPNMask
			// The QP pair's port from now on, as drivers call
			// rdma_get_udp_sport when the AV is set.
			d.deferClose(d.srcPorts.release(q.src, &d.ctr))
			q.src = d.srcPorts.acquire(sourcePortOf(q), &d.ctr)
			q.ePSN = a.RQPSN & psnMask
			q.minRNR = a.MinRNRTimer & 31
			q.nakSent, q.inMsg, q.msn = false, false, 0
		}
	case hca.QPStateRTS:
		if q.typ == hca.QPTypeRC {
			if q.state == hca.QPStateRTR {
				p := a.SQPSN & psnMask
				q.nextPSN, q.una, q.txPSN, q.sentEnd = p, p, p, p
			}
			q.timeout = 0
			if a.Timeout != 0 {
				q.timeout = max(d.cfg.scale(TransportTimeout(a.Timeout)), d.cfg.MinAckTimeout)
			}
			q.retryCount, q.rnrRetry = max(min(a.RetryCount, 7), d.cfg.MinRetryCount), min(a.RNRRetry, 7)
			q.retryLeft, q.rnrLeft = q.retryCount, q.rnrRetry
		} else if q.state == hca.QPStateRTR {
			q.udPSN = a.SQPSN & psnMask
		}
	case hca.QPStateError:
		q.toError()
		return nil
	case hca.QPStateReset:
		txWait = q.reset()
	}
	q.state = a.State
	return nil
}

// toError moves the QP to Error and flushes every outstanding work
// request, in order, with WRFlushErr; an SRQ QP then raises
// LAST_WQE_REACHED once (the responder takes WQEs straight from the SRQ,
// so nothing of it is left on the QP). mu held.
func (q *qp) toError() {
	q.state = hca.QPStateError
	q.disarmTimer()
	for q.sqLen > 0 {
		w := &q.sq[q.sqHead]
		q.completeSendAfter(w.id, hca.StatusWRFlushErr, 0, w.zcGen)
		q.popSend()
	}
	q.txIdx, q.txOff = 0, 0
	if q.curValid {
		q.completeRecv(q.cur.ID, hca.StatusWRFlushErr, 0, nil)
		q.curValid = false
	}
	q.inMsg = false
	for q.rq.Len() > 0 {
		wr, _ := q.rq.Pop()
		q.completeRecv(wr.ID, hca.StatusWRFlushErr, 0, nil)
	}
	if q.srq != nil && !q.lastWQESent {
		q.lastWQESent = true
		if q.cfg.OnEvent != nil {
			q.dev.deferEvent(q.cfg.OnEvent, hca.AsyncEvent{Type: hca.EventQPLastWQEReached, QPN: q.qpn, Context: q.cfg.Context})
		}
	}
}

// reset discards all work without completions (IBTA: Reset empties the
// queues) and returns the work batch whose transmit must be over before
// the send buffers are the consumer's again (Device.awaitTx). mu held.
func (q *qp) reset() uint64 {
	q.disarmTimer()
	clear(q.sq)
	q.sqHead, q.sqLen, q.txIdx, q.txOff = 0, 0, 0, 0
	q.rq.Clear()
	q.cur, q.curValid, q.inMsg, q.curOff = hca.RecvWR{}, false, false, 0
	q.ackPending = false
	return q.zcGen
}

func (q *qp) PostRecv(wrs []hca.RecvWR) (int, error) {
	d := q.dev
	d.mu.Lock()
	defer d.unlock()
	if q.destroyed.Load() {
		return 0, q.errDestroyed("post recv")
	}
	if q.srq != nil {
		return 0, fmt.Errorf("rocev2: post recv on SRQ QP %#x: %w", q.qpn, hca.ErrInvalidArgument)
	}
	if q.state == hca.QPStateReset {
		return 0, fmt.Errorf("rocev2: post recv QP %#x in %v: %w", q.qpn, q.state, hca.ErrInvalidState)
	}
	for i := range wrs {
		if q.state == hca.QPStateError {
			q.completeRecv(wrs[i].ID, hca.StatusWRFlushErr, 0, nil)
			continue
		}
		if q.rq.Full() {
			return i, fmt.Errorf("rocev2: post recv %d of %d: %w", i, len(wrs), hca.ErrQueueFull)
		}
		q.rq.Push(wrs[i])
	}
	return len(wrs), nil
}

// takeRecv takes the next receive buffer from the SRQ or the own RQ.
func (q *qp) takeRecv() (hca.RecvWR, bool) {
	if q.srq != nil {
		return q.srq.take()
	}
	return q.rq.Pop()
}

func (q *qp) PostSend(wrs []hca.SendWR) (int, error) {
	d := q.dev
	d.mu.Lock()
	defer d.unlock()
	if q.destroyed.Load() {
		return 0, q.errDestroyed("post send")
	}
	switch q.state {
	case hca.QPStateError:
		for i := range wrs {
			q.completeSend(wrs[i].ID, hca.StatusWRFlushErr, 0)
		}
		return len(wrs), nil
	case hca.QPStateRTS:
	default:
		return 0, fmt.Errorf("rocev2: post send QP %#x in %v: %w", q.qpn, q.state, hca.ErrInvalidState)
	}
	if q.typ == hca.QPTypeRC {
		return q.postSendRC(wrs)
	}
	return q.postSendUD(wrs)
}

func (q *qp) AttachMcast(mgid hca.GID) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("attach")
	}
	added, err := q.mcast.CheckAttach(q.typ, mgid)
	if err != nil {
		return fmt.Errorf("rocev2: QP %#x: %w", q.qpn, err)
	}
	if !added {
		return nil
	}
	if err := d.attachGroup(q, mgid); err != nil {
		return err
	}
	q.mcast.Add(mgid)
	return nil
}

func (q *qp) DetachMcast(mgid hca.GID) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("detach")
	}
	if err := q.mcast.Detach(mgid); err != nil {
		return fmt.Errorf("rocev2: QP %#x: %w", q.qpn, err)
	}
	return d.detachGroup(q, mgid)
}

// Destroy releases the QP without generating completions (as rxe);
// completions already queued stay on their CQs.
func (q *qp) Destroy() error {
	d := q.dev
	d.mu.Lock()
	if q.destroyed.Load() {
		d.mu.Unlock()
		return q.errDestroyed("destroy")
	}
	if err := q.mcast.CheckDestroy(); err != nil {
		d.mu.Unlock()
		return fmt.Errorf("rocev2: destroy QP %#x: %w", q.qpn, err)
	}
	q.destroyed.Store(true)
	q.disarmTimer()
	d.dropAfterTx(q)
	txWait := q.zcGen
	defer d.awaitTx(txWait)
	defer d.unlock() // closes the QP's source socket, outside mu
	d.deferClose(d.srcPorts.release(q.src, &d.ctr))
	q.src = nil
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	if d.gsi == q {
		d.gsi = nil
	}
	q.sendCQ.refs--
	q.recvCQ.refs--
	if q.srq != nil {
		q.srq.refs--
	}
	clear(q.sq)
	q.rq.Clear()
	return nil
}

// Destroyed reports whether Destroy has run, for the CQ ring.
func (q *qp) Destroyed() bool { return q.destroyed.Load() }

// errDestroyed counts a verb called on a destroyed QP
// (Stats.DestroyedQPOps) and returns its error.
func (q *qp) errDestroyed(verb string) error {
	q.dev.ctr.destroyedQPOps.Add(1)
	return fmt.Errorf("rocev2: %s QP %#x: %w", verb, q.qpn, hca.ErrDestroyed)
}

func (q *qp) completeSend(id uint64, st hca.Status, n int) { q.completeSendAfter(id, st, n, 0) }

// completeSendAfter completes a send whose buffer work batch gen (0:
// none) read without copying: the completion hands the buffer back, so
// it waits until that batch is on the socket, and every send completion
// behind a waiting one waits too, so they stay in order.
func (q *qp) completeSendAfter(id uint64, st hca.Status, n int, gen uint64) {
	d := q.dev
	wc := hca.WC{ID: id, Status: st, Opcode: hca.WCSend, ByteLen: n, QPN: q.qpn, Context: q.cfg.Context}
	if k := len(d.afterTx); k > 0 || gen > d.txDone.Load() {
		if k > 0 {
			gen = max(gen, d.afterTx[k-1].gen)
		}
		d.afterTx = append(d.afterTx, afterTxWC{q: q, wc: wc, gen: gen})
		return
	}
	q.sendCQ.push(q, &wc)
}

// udInfo carries the UD-only fields of a receive completion.
type udInfo struct {
	srcQPN hca.QPN
	srcGID hca.GID
	pkey   hca.PKey
	// flags is the checksum verdict on the payload (rxCsumFlags) as the
	// receiving QP reports it.
	flags hca.WCFlags
	// csum and csumDone keep the verdict once it is made, so a group
	// datagram delivered to several QPs is verified once.
	csum     hca.WCFlags
	csumDone bool
}

func (q *qp) completeRecv(id uint64, st hca.Status, n int, ud *udInfo) {
	wc := hca.WC{ID: id, Status: st, Opcode: hca.WCRecv, ByteLen: n, QPN: q.qpn, Context: q.cfg.Context}
	if ud != nil {
		wc.SrcQPN, wc.SrcGID, wc.PKey = ud.srcQPN, ud.srcGID, ud.pkey
		if st == hca.StatusSuccess {
			wc.Flags = ud.flags
		}
	}
	q.recvCQ.push(q, &wc)
}

func (q *qp) armTimer(k timerKind, after time.Duration) {
	d := q.dev
	q.timer, q.deadline = k, time.Now().Add(after)
	d.timed[q] = struct{}{}
	// The loop rescans every armed QP when it wakes: a deadline at or
	// after its next wake-up is found then. An RC requester re-arms its
	// retry timer on every burst after going idle, so waking the loop
	// only for an earlier deadline saves a goroutine hand-off per burst.
	if d.timerWake.IsZero() || q.deadline.Before(d.timerWake) {
		d.kickTimers()
	}
}

func (q *qp) disarmTimer() {
	q.timer = timerNone
	delete(q.dev.timed, q)
}

// fireTimer runs when the deadline passed; mu held.
func (q *qp) fireTimer() {
	k := q.timer
	q.disarmTimer()
	if q.destroyed.Load() || q.state != hca.QPStateRTS {
		return
	}
	switch k {
	case timerRetry:
		q.retryTimeout()
	case timerRNR:
		q.pump()
	}
}

// pkey is the P_Key at the QP's index, or 0 (matching nothing) if the
// table shrank below it; mu held.
func (q *qp) pkey() hca.PKey { return q.dev.pkeyAt(q.pkeyIndex) }
