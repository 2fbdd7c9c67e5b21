package soft

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/internal/core"
)

// sendState is the state of an RC QP's send queue head.
//
//go:generate go tool stringer -type=sendState -linecomment
type sendState int

const (
	// sendReady: the head work request may be attempted.
	sendReady sendState = iota // ready
	// sendRNRWait: an RNR NAK came back; waiting out the RNR timer.
	sendRNRWait // rnr-wait
	// sendBufferWait: RNR retry 7; parked on the receiver's queue until a
	// buffer is posted.
	sendBufferWait // buffer-wait
	// sendRetryWait: the peer did not answer; waiting out the transport
	// timeout before retransmitting.
	sendRetryWait // retry-wait
)

// qp is a soft queue pair. Everything but destroyed is guarded by f.mu.
type qp struct {
	f      *Fabric
	dev    *Device
	qpn    hca.QPN
	typ    hca.QPType
	cfg    hca.QPConfig
	sendCQ *cq
	recvCQ *cq
	srq    *srq

	destroyed atomic.Bool // read by Poll without f.mu

	state     hca.QPState
	gen       uint64 // bumped on every change that cancels pending timers
	pkeyIndex int
	qkey      hca.QKey
	mcast     core.Attachments
	lastWQE   bool // LAST_WQE_REACHED raised since the last Reset

	// RC connection attributes.
	destGID    hca.GID
	destQPN    hca.QPN
	minRNR     uint8
	retryCount uint8
	rnrRetry   uint8
	timeout    uint8
	peer       *qp // cached lookup of (destGID, destQPN)

	sq        core.Queue[hca.SendWR] // RC sends not yet completed
	sendState sendState
	rnrLeft   int
	retryLeft int
	waitingOn *recvQueue // in sendBufferWait

	rq recvQueue // own receive queue (unused with an SRQ)
}

var _ hca.QP = (*qp)(nil)

// CreateQP makes an RC, UD or GSI QP in the Reset state.
func (d *Device) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	f := d.f
	if cfg.MaxSendWR == 0 {
		cfg.MaxSendWR = defaultQueueWR
	}
	if cfg.MaxRecvWR == 0 {
		cfg.MaxRecvWR = defaultQueueWR
	}
	if cfg.MaxSendWR < 0 || cfg.MaxSendWR > maxQPWR || cfg.MaxRecvWR < 0 || cfg.MaxRecvWR > maxQPWR {
		return nil, fmt.Errorf("soft: %s: create QP with %d/%d WRs: %w", d.name, cfg.MaxSendWR, cfg.MaxRecvWR, hca.ErrInvalidArgument)
	}
	switch cfg.Type {
	case hca.QPTypeRC, hca.QPTypeUD, hca.QPTypeGSI:
	default:
		return nil, fmt.Errorf("soft: %s: create QP of type %s: %w", d.name, cfg.Type, hca.ErrInvalidArgument)
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.dev != d || rcq.dev != d {
		return nil, fmt.Errorf("soft: %s: create QP: CQs missing or not of this device: %w", d.name, hca.ErrInvalidArgument)
	}
	var s *srq
	if cfg.SRQ != nil {
		var ok bool
		if s, ok = cfg.SRQ.(*srq); !ok || s == nil || s.dev != d {
			return nil, fmt.Errorf("soft: %s: create QP: SRQ not of this device: %w", d.name, hca.ErrInvalidArgument)
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("soft: %s: create QP: %w", d.name, hca.ErrDestroyed)
	}
	if scq.destroyed.Load() || rcq.destroyed.Load() || (s != nil && s.destroyed) {
		return nil, fmt.Errorf("soft: %s: create QP on destroyed CQ or SRQ: %w", d.name, hca.ErrDestroyed)
	}
	var qpn hca.QPN
	if cfg.Type == hca.QPTypeGSI {
		if d.gsi != nil {
			return nil, fmt.Errorf("soft: %s: create GSI QP: %w", d.name, hca.ErrBusy)
		}
		qpn = hca.QPNGSI
	} else {
		var err error
		if qpn, err = d.allocQPN(); err != nil {
			return nil, fmt.Errorf("soft: %s: create QP: %w", d.name, err)
		}
	}
	q := &qp{
		f: f, dev: d, qpn: qpn, typ: cfg.Type, cfg: cfg,
		sendCQ: scq, recvCQ: rcq, srq: s,
		state: hca.QPStateReset,
		sq:    core.NewQueue[hca.SendWR](cfg.MaxSendWR),
	}
	if s == nil {
		q.rq.wrs = core.NewQueue[hca.RecvWR](cfg.MaxRecvWR)
	} else {
		s.users++
	}
	if cfg.Type == hca.QPTypeGSI {
		d.gsi = q
		f.live.gsi++
	}
	scq.users++
	rcq.users++
	d.qps[qpn] = q
	f.live.qps++
	return q, nil
}

func (q *qp) QPN() hca.QPN     { return q.qpn }
func (q *qp) Type() hca.QPType { return q.typ }
func (q *qp) String() string   { return fmt.Sprintf("%s QP %#x on %s", q.typ, q.qpn, q.dev.name) }
func (q *qp) pkey() hca.PKey   { return q.dev.pkeyAt(q.pkeyIndex) }

// acceptsPKey is the receive-side partition check (IBTA 10.9.3): the GSI
// QP takes every P_Key the port's table matches, any other QP only those
// matching its own P_Key. Under f.mu.
func (q *qp) acceptsPKey(k hca.PKey) bool {
	if q.typ != hca.QPTypeGSI {
		return k.Matches(q.pkey())
	}
	_, ok := hca.MatchingPKeyIndex(q.dev.pkeys, k)
	return ok
}
func (q *qp) recvQueue() *recvQueue {
	if q.srq != nil {
		return &q.srq.rq
	}
	return &q.rq
}

// State returns the current state (the last one, once destroyed).
func (q *qp) State() hca.QPState {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	return q.state
}

// Destroyed reports whether Destroy has run, for the CQ ring.
func (q *qp) Destroyed() bool { return q.destroyed.Load() }

// errDestroyed counts an operation on a destroyed QP and builds its error.
func (q *qp) errDestroyed(op string) error {
	q.f.stats.destroyedQPOps.Add(1)
	return fmt.Errorf("soft: %s on %s: %w", op, q, hca.ErrDestroyed)
}

// Modify moves the QP to attr.State, reading the attributes that
// transition needs. Illegal transitions and bad attributes change nothing.
func (q *qp) Modify(attr hca.QPAttr) error {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("modify")
	}
	if err := hca.CheckTransition(q.typ, q.state, attr.State); err != nil {
		return fmt.Errorf("soft: modify %s: %w", q, err)
	}
	bad := func(what string, v any) error {
		return fmt.Errorf("soft: modify %s to %s: %s %v: %w", q, attr.State, what, v, hca.ErrInvalidArgument)
	}
	switch attr.State {
	case hca.QPStateReset:
		f.resetLocked(q)
		return nil
	case hca.QPStateError:
		f.toError(q)
		return nil
	case hca.QPStateInit:
		if attr.PKeyIndex < 0 || attr.PKeyIndex >= len(q.dev.pkeys) {
			return bad("P_Key index", attr.PKeyIndex)
		}
		q.pkeyIndex = attr.PKeyIndex
		switch q.typ {
		case hca.QPTypeUD:
			q.qkey = attr.QKey
		case hca.QPTypeGSI:
			q.qkey = hca.QKeyGSI
		}
	case hca.QPStateRTR:
		if q.typ == hca.QPTypeRC {
			if attr.PathMTU != 0 && !attr.PathMTU.Valid() {
				return bad("path MTU", attr.PathMTU)
			}
			if attr.MinRNRTimer > 31 {
				return bad("min RNR timer", attr.MinRNRTimer)
			}
			q.destGID = attr.DestGID
			q.destQPN = attr.DestQPN & hca.QPNMask
			q.minRNR = attr.MinRNRTimer
			q.peer = nil
		}
	case hca.QPStateRTS:
		if q.typ == hca.QPTypeRC {
			if attr.RetryCount > 7 || attr.RNRRetry > 7 {
				return bad("retry counts", [2]uint8{attr.RetryCount, attr.RNRRetry})
			}
			q.retryCount = attr.RetryCount
			q.rnrRetry = attr.RNRRetry
			q.timeout = attr.Timeout
			q.rnrLeft = int(attr.RNRRetry)
			q.retryLeft = int(attr.RetryCount)
		}
	}
	q.state = attr.State
	return nil
}

// resetLocked discards all posted work without completions (IBTA: the
// Reset state has empty queues).
func (f *Fabric) resetLocked(q *qp) {
	q.state = hca.QPStateReset
	q.gen++
	q.sq.Clear()
	q.rq.wrs.Clear()
	q.sendState = sendReady
	q.waitingOn = nil
	q.lastWQE = false
	q.peer = nil
	f.wakeWaiters(q.recvQueue()) // parked senders retry and find q gone
}

// toError moves q to Error: every posted send and own-RQ receive is
// flushed with WR_FLUSH_ERR in order, an SRQ-attached QP raises
// LAST_WQE_REACHED once, and senders parked on q retry (and fail).
func (f *Fabric) toError(q *qp) {
	if q.state == hca.QPStateError {
		return
	}
	q.state = hca.QPStateError
	q.gen++
	q.sendState = sendReady
	q.waitingOn = nil
	for {
		wr, ok := q.sq.Pop()
		if !ok {
			break
		}
		f.complete(q.sendCQ, q, q.sendWC(wr.ID, hca.StatusWRFlushErr, 0))
	}
	for {
		wr, ok := q.rq.wrs.Pop()
		if !ok {
			break
		}
		f.complete(q.recvCQ, q, q.recvWC(wr.ID, hca.StatusWRFlushErr, 0))
	}
	if q.srq != nil && !q.lastWQE {
		q.lastWQE = true
		f.stats.lastWQE.Add(1)
		ev := hca.AsyncEvent{Type: hca.EventQPLastWQEReached, QPN: q.qpn, Context: q.cfg.Context}
		fn := q.cfg.OnEvent
		if d := f.faults.LastWQEDelay; d > 0 {
			f.sched.after(d, func() { f.event(fn, ev) })
		} else {
			f.event(fn, ev)
		}
	}
	f.wakeWaiters(q.recvQueue())
}

func (q *qp) sendWC(id uint64, st hca.Status, n int) hca.WC {
	return hca.WC{ID: id, Status: st, Opcode: hca.WCSend, ByteLen: n, QPN: q.qpn, Context: q.cfg.Context}
}

func (q *qp) recvWC(id uint64, st hca.Status, n int) hca.WC {
	return hca.WC{ID: id, Status: st, Opcode: hca.WCRecv, ByteLen: n, QPN: q.qpn, Context: q.cfg.Context}
}

// PostSend posts sends. RC sends queue behind each other and complete when
// delivered or failed; UD sends are delivered (or dropped) at once. On a
// QP in Error every send completes with WR_FLUSH_ERR.
func (q *qp) PostSend(wrs []hca.SendWR) (int, error) {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed.Load() {
		return 0, q.errDestroyed("post send")
	}
	switch q.state {
	case hca.QPStateError:
		for i := range wrs {
			f.complete(q.sendCQ, q, q.sendWC(wrs[i].ID, hca.StatusWRFlushErr, 0))
		}
		return len(wrs), nil
	case hca.QPStateRTS:
	default:
		return 0, fmt.Errorf("soft: post send on %s in %s: %w", q, q.state, hca.ErrInvalidState)
	}
	if q.typ != hca.QPTypeRC {
		for i := range wrs {
			if err := f.sendUD(q, &wrs[i]); err != nil {
				return i, fmt.Errorf("soft: post send %d on %s: %w", i, q, err)
			}
			f.complete(q.sendCQ, q, q.sendWC(wrs[i].ID, hca.StatusSuccess, len(wrs[i].Data)))
		}
		return len(wrs), nil
	}
	for i := range wrs {
		if q.state == hca.QPStateRTS && q.sq.Full() {
			f.progressSends(q)
		}
		if q.state == hca.QPStateError {
			// An earlier send of this batch failed and errored the QP.
			f.complete(q.sendCQ, q, q.sendWC(wrs[i].ID, hca.StatusWRFlushErr, 0))
			continue
		}
		if err := f.checkRCOffload(&wrs[i]); err != nil {
			return i, fmt.Errorf("soft: post send %d of %d on %s: %w", i, len(wrs), q, err)
		}
		if !q.sq.Push(wrs[i]) {
			return i, fmt.Errorf("soft: post send %d of %d on %s: %w", i, len(wrs), q, hca.ErrQueueFull)
		}
	}
	f.progressSends(q)
	return len(wrs), nil
}

// PostRecv posts to the QP's own receive queue.
func (q *qp) PostRecv(wrs []hca.RecvWR) (int, error) {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed.Load() {
		return 0, q.errDestroyed("post recv")
	}
	if q.srq != nil {
		return 0, fmt.Errorf("soft: post recv on %s, which uses an SRQ: %w", q, hca.ErrInvalidArgument)
	}
	switch q.state {
	case hca.QPStateReset:
		return 0, fmt.Errorf("soft: post recv on %s in %s: %w", q, q.state, hca.ErrInvalidState)
	case hca.QPStateError:
		for i := range wrs {
			f.complete(q.recvCQ, q, q.recvWC(wrs[i].ID, hca.StatusWRFlushErr, 0))
		}
		return len(wrs), nil
	}
	for i := range wrs {
		if !q.rq.wrs.Push(wrs[i]) {
			f.wakeWaiters(&q.rq)
			return i, fmt.Errorf("soft: post recv %d of %d on %s: %w", i, len(wrs), q, hca.ErrQueueFull)
		}
	}
	f.wakeWaiters(&q.rq)
	return len(wrs), nil
}

// AttachMcast joins a UD QP to the multicast group mgid.
func (q *qp) AttachMcast(mgid hca.GID) error {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("attach mcast")
	}
	added, err := q.mcast.Attach(q.typ, mgid)
	if err != nil {
		return fmt.Errorf("soft: %s: %w", q, err)
	}
	if !added {
		return nil
	}
	f.groups[mgid] = append(f.groups[mgid], q)
	f.live.mcast++
	return nil
}

// DetachMcast leaves the group.
func (q *qp) DetachMcast(mgid hca.GID) error {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("detach mcast")
	}
	if err := f.detachLocked(q, mgid); err != nil {
		return fmt.Errorf("soft: detach %s: %w", q, err)
	}
	return nil
}

func (f *Fabric) detachLocked(q *qp, mgid hca.GID) error {
	if err := q.mcast.Detach(mgid); err != nil {
		return err
	}
	members := slices.DeleteFunc(f.groups[mgid], func(m *qp) bool { return m == q })
	if len(members) == 0 {
		delete(f.groups, mgid)
	} else {
		f.groups[mgid] = members
	}
	f.live.mcast--
	return nil
}

// Destroy releases the QP. It fails with ErrBusy while attached to
// multicast groups (as rxe does). Queued completions stay on their CQs
// unless Faults.DestroyedQPCompletions says purge.
func (q *qp) Destroy() error {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed.Load() {
		return q.errDestroyed("destroy")
	}
	if err := q.mcast.CheckDestroy(); err != nil {
		return fmt.Errorf("soft: destroy %s: %w", q, err)
	}
	f.destroyQPLocked(q)
	return nil
}

func (f *Fabric) destroyQPLocked(q *qp) {
	q.destroyed.Store(true)
	q.gen++
	q.sq.Clear()
	q.rq.wrs.Clear()
	q.sendState = sendReady
	q.waitingOn = nil
	q.peer = nil
	d := q.dev
	delete(d.qps, q.qpn)
	if q.typ == hca.QPTypeGSI {
		d.gsi = nil
		f.live.gsi--
	} else {
		d.freed = append(d.freed, q.qpn)
		if len(d.freed) > 64 {
			d.freed = slices.Delete(d.freed, 0, len(d.freed)-64)
		}
	}
	q.sendCQ.users--
	q.recvCQ.users--
	if q.srq != nil {
		q.srq.users--
	}
	f.live.qps--
	if f.faults.DestroyedQPCompletions == PurgeCompletionsOnDestroy {
		n := q.sendCQ.purge(q)
		if q.recvCQ != q.sendCQ {
			n += q.recvCQ.purge(q)
		}
		f.stats.purged.Add(uint64(n))
	}
	f.wakeWaiters(q.recvQueue()) // parked senders retry and find q gone
}
