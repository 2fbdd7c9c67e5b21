package ipoibcm

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/mutation"
	"github.com/ipoibcm/ipoib/napi"
)

// This file is the passive-connection state machine: how a connection the
// peer opened is torn down while its completions may still be in flight
// (docs/teardown.md; Linux ipoib_cm_rx_event_handler, ipoib_cm_start_rx_drain,
// ipoib_cm_rx_reap). Every change of rxConn.state goes through
// rxTransition, on the control loop; other goroutines post events to it
// with postRX. The route of a stale connection, top to bottom:
//
//	rxLive  --rxEvStale (scan) / rxEvDisconnected / rxEvQPFatal / rxEvHostDown / rxEvShutdown-->
//	        mark dead under the RX poll lock, QP to Error
//	rxError --rxEvLastWQE (the SRQ's last WQE of the QP is consumed)-->
//	        join the flush list; startDrain posts one drain WR
//	rxFlush --rxEvDrainPosted-->
//	rxDrain --rxEvDrained (the RX poller polled the drain WR's flush
//	        completion: nothing of the QP is left in the RX CQ)-->
//	        destroy QP and CM id
//	rxDestroyed
//
// Without SRQ the connection's own ring replaces LAST_WQE and the drain:
// rxEvRingFlushed, when its last posted receive has completed, destroys it.
// rxEvForce (Close's DrainTimeout ran out) destroys whatever is left.

// rxState is the life of a passive (receive-only) connection: Linux's
// passive_ids / rx_error / rx_flush / rx_drain lists as states
// (docs/linux.md §4.1).
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
	// rxDestroyed: QP and CM id gone, out of the passive set
	rxDestroyed // destroyed
)

// rxEvent is what happens to a passive connection.
//
//go:generate go tool stringer -type=rxEvent -linecomment
type rxEvent int

const (
	// rxEvStale: the stale scan found it idle longer than StaleAfter.
	rxEvStale rxEvent = iota // stale
	// rxEvDisconnected: the CM reported DREQ, REJ, a stale connection or
	// a time-out.
	rxEvDisconnected // cm-disconnect
	// rxEvQPFatal: the QP hit a fatal error.
	rxEvQPFatal // qp-fatal
	// rxEvFlushedLive: a receive of its own ring completed flushed while
	// it was live: the QP errored under us.
	rxEvFlushedLive // flushed-while-live
	// rxEvReplaced: a new REQ from its GID found the per-GID limit full
	// and takes its place (rxlimit.go).
	rxEvReplaced // replaced
	// rxEvHostDown: the host set ib0 down (ipoib_cm_dev_stop).
	rxEvHostDown // host-down
	// rxEvShutdown: Close tears every connection down.
	rxEvShutdown // shutdown
	// rxEvLastWQE: LAST_WQE_REACHED: the QP's last SRQ WQE has its
	// completion queued.
	rxEvLastWQE // last-wqe
	// rxEvDrainPosted: a drain WR covering it was posted.
	rxEvDrainPosted // drain-posted
	// rxEvDrained: the drain WR's completion was polled.
	rxEvDrained // drained
	// rxEvRingFlushed: without SRQ, its last posted receive completed.
	rxEvRingFlushed // ring-flushed
	// rxEvForce: Close's DrainTimeout ran out.
	rxEvForce // force
)

// teardown reports whether ev asks for a live connection to go.
func (ev rxEvent) teardown() bool { return ev <= rxEvShutdown }

// passiveSet is the owner of the passive connections: their admission
// (acceptREQ, on the CM goroutine, bounded by rxLimits), the set, their
// state machine and its reaper, the stale scan, and the events they emit.
// The reaper's lists are the control loop's.
//
// mu guards the set, the admission's bookkeeping and every connection's
// state: the CM goroutine admits under it, the control loop changes
// states under it, Stats and the neighbour aging read under it. Lock
// order: Interface.mu, then mu, then the neighbour table's (acceptREQ
// learns the peer inside it; the aging evicts only neighbours no passive
// connection names, with both held). It is never held across napi Sync,
// PostSend, a host write, a QP or CM id destroy, or a CM call.
type passiveSet struct {
	passiveEnv
	mu     sync.Mutex
	set    map[*rxConn]struct{}
	limits rxLimits
	reaper reaper

	drainBuf   []byte // the drain WR's (empty) buffer
	staleAfter time.Duration
	recvq      int // a non-SRQ connection's ring size
}

// passiveEnv is what the passive set works with, fixed at New: narrow
// pieces of the interface, never the Interface itself.
type passiveEnv struct {
	neigh *neighbourTable // its own lock (neigh.mu), taken inside passiveSet.mu
	psn   *psnSource      // the starting PSNs of our REPs
	dev   hca.Device
	cq    hca.CQ   // the RX CQ: send and receive CQ of every passive QP
	srq   *srqRing // nil: every connection has its own ring
	// poller is the RX poller: its poll lock orders the dead flag.
	poller *napi.Context
	post   func(func()) // onto the control loop
	// life says whether the interface is running (REQs are refused
	// before Start and from Close on); hostLink whether the host has ib0
	// down (refused too).
	life     *ifStateCell
	hostLink *hostLinkCell
	portMTU  hca.MTU // the largest path MTU a REQ may ask for
	udQPN    hca.QPN // our UD QPN, in the REP's private data
	obs      observer
	mut      mutation.Soak
	log      *slog.Logger
}

func (p *passiveSet) init(env passiveEnv, cfg *Config) {
	p.passiveEnv = env
	p.set = make(map[*rxConn]struct{})
	p.staleAfter, p.recvq = cfg.StaleAfter, cfg.RecvQueueSize
	p.limits.init(cfg, env.srq == nil)
}

// reaper is the control loop's state of the passive teardown.
type reaper struct {
	flush []*rxConn // LAST_WQE seen, waiting for a drain
	drain []*rxConn // covered by the outstanding drain WR

	ctr reaperCounters
}

// reaperCounters count the passive teardown's work. Atomics: the RX
// poller and the backends' event goroutines count too.
type reaperCounters struct {
	staleScans, staleReaped, movedToError            atomic.Uint64
	lastWQESeen, lateLastWQE                         atomic.Uint64
	drainsPosted, drainsCompleted, drainPostFailures atomic.Uint64
	reaped, forced                                   atomic.Uint64 // forced: by Close's DrainTimeout
}

// postRX hands ev for rc to the control loop; it never blocks (CM
// goroutine, backend event goroutines, the RX poller).
func (p *passiveSet) postRX(rc *rxConn, ev rxEvent) {
	p.post(func() { p.rxTransition(rc, ev) })
}

// rxTransition applies ev to rc (control loop): the one place rc.state
// changes. Events that do not apply to the current state are ignored:
// duplicates, and late ones for a connection already on its way out.
func (p *passiveSet) rxTransition(rc *rxConn, ev rxEvent) {
	p.mu.Lock()
	from := rc.state
	p.mu.Unlock()
	if from == rxDestroyed {
		return
	}
	switch {
	case ev.teardown():
		if from != rxLive {
			return
		}
		p.markDead(rc)
		p.emitRX(EventDeadSet, rc, 0, fmt.Sprint(ev))
		p.setRXState(rc, rxError)
		p.reaper.ctr.movedToError.Add(1)
		p.log.Debug("passive teardown", "peer", rc.peer, "qpn", rc.qp.QPN(), "why", ev)
		if err := rc.qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
			p.log.Warn("RX QP to Error", "peer", rc.peer, "err", err)
		}
		p.emitRX(EventQPError, rc, 0, "")
		if p.mut.SkipDrain || (p.limits.ownRings && rc.recvCount.Load() == 0) {
			p.reapRX(rc)
		}

	case ev == rxEvLastWQE:
		switch from {
		case rxLive:
			// The backend errored the QP by itself (or it raced the
			// REP): dead first.
			p.reaper.ctr.lateLastWQE.Add(1)
			p.markDead(rc)
			p.emitRX(EventDeadSet, rc, 0, "LAST_WQE on a live connection")
		case rxError:
		default:
			return // a duplicate
		}
		p.emitRX(EventLastWQE, rc, 0, "")
		if p.mut.SkipDrain {
			p.reapRX(rc)
			return
		}
		p.setRXState(rc, rxFlush)
		p.reaper.flush = append(p.reaper.flush, rc)
		p.startDrain()

	case ev == rxEvDrainPosted:
		if from == rxFlush {
			p.setRXState(rc, rxDrain)
		}

	case ev == rxEvDrained:
		p.emitRX(EventDrainCompleted, rc, 0, "")
		p.reapRX(rc)

	case ev == rxEvRingFlushed:
		if from == rxLive {
			// The QP errored without us: dead before reaping.
			p.markDead(rc)
			p.emitRX(EventDeadSet, rc, 0, "ring flushed on a live connection")
		}
		p.reapRX(rc)

	case ev == rxEvForce:
		p.poller.Sync(func() { rc.dead.Store(true) })
		p.reaper.ctr.forced.Add(1)
		p.reapRX(rc)
	}
}

func (p *passiveSet) setRXState(rc *rxConn, s rxState) {
	p.mu.Lock()
	rc.state = s
	p.mu.Unlock()
}

// emitRX tells the observer of a passive connection's step (control
// loop).
func (p *passiveSet) emitRX(kind EventKind, rc *rxConn, elapsed time.Duration, detail string) {
	if !p.obs.on() {
		return
	}
	var remote hca.QPN
	if rc.cmConn != nil {
		remote = rc.cmConn.RemoteQPN()
	}
	p.obs.emit(kind, rc.qp.QPN(), remote, rc.peer.GID(), elapsed, detail)
}

// release gives back what acceptREQ reserved for a REQ it then rejected,
// counted in why: the connection slot and, without SRQ, the ring.
func (p *passiveSet) release(rc *rxConn, why *atomic.Uint64) {
	why.Add(1)
	p.mu.Lock()
	p.limits.releaseLocked(rc)
	p.mu.Unlock()
}

// markDead sets rc's dead flag under the RX poll lock: no poll that began
// before is still running, and every later one sees the flag, so no
// completion of the connection reaches the host from now on.
func (p *passiveSet) markDead(rc *rxConn) {
	rc.deadAt = time.Now() // the passive teardown time starts here
	if p.mut.SkipDeadFlag {
		return
	}
	p.poller.Sync(func() { rc.dead.Store(true) })
}

// startDrain posts the drain WR for every connection on the flush list,
// unless one is already outstanding (the RX CQ has one spare slot). The WR
// goes on one errored QP of the batch; its flush completion lands on the
// RX CQ behind every earlier completion of every QP in the batch.
func (p *passiveSet) startDrain() {
	r := &p.reaper
	if len(r.drain) > 0 || len(r.flush) == 0 {
		return
	}
	wr := [1]hca.SendWR{{ID: wrDrain, Data: p.drainBuf[:0]}}
	for _, rc := range r.flush {
		if n, err := rc.qp.PostSend(wr[:]); err == nil && n == 1 {
			p.reaper.ctr.drainsPosted.Add(1)
			r.drain, r.flush = r.flush, r.drain[:0]
			on := fmt.Sprintf("drain WR on qpn 0x%06x, covering %d", uint32(rc.qp.QPN()), len(r.drain))
			for _, d := range r.drain {
				p.rxTransition(d, rxEvDrainPosted)
				p.emitRX(EventDrainPosted, d, 0, on)
			}
			return
		}
		p.reaper.ctr.drainPostFailures.Add(1)
	}
	// No QP of the batch took the drain WR; Close's deadline forces them.
	p.log.Warn("drain WR refused by every flushed QP", "count", len(r.flush))
}

// drainPolled: the RX poller polled the drain WR's completion (it never
// waits); the reaper finishes on the control loop.
func (p *passiveSet) drainPolled() {
	p.reaper.ctr.drainsCompleted.Add(1)
	p.post(p.onDrainDone)
}

// onDrainDone runs when the RX poller polled the drain completion: every
// connection it covers has no completion left in the RX CQ.
func (p *passiveSet) onDrainDone() {
	r := &p.reaper
	covered := r.drain
	r.drain = nil
	for _, rc := range covered {
		p.rxTransition(rc, rxEvDrained)
	}
	p.startDrain()
}

// reapRX destroys the QP and the CM id (control loop, never the poller).
func (p *passiveSet) reapRX(rc *rxConn) {
	p.mu.Lock()
	if rc.state == rxDestroyed {
		p.mu.Unlock()
		return
	}
	rc.state = rxDestroyed
	delete(p.set, rc)
	p.limits.releaseLocked(rc)
	p.mu.Unlock()
	if rc.cmConn != nil {
		rc.cmConn.Destroy()
	}
	if err := rc.qp.Destroy(); err != nil {
		p.log.Warn("destroy RX QP", "peer", rc.peer, "err", err)
	}
	p.reaper.ctr.reaped.Add(1)
	if p.obs.on() {
		var elapsed time.Duration
		if !rc.deadAt.IsZero() {
			elapsed = time.Since(rc.deadAt)
		}
		p.emitRX(EventReaped, rc, elapsed, "")
	}
}

// stats is the passive set's part of Stats: the admission's bookkeeping,
// and every connection's ConnInfo appended to out (what 'ipoib show'
// lists), read together under mu.
func (p *passiveSet) stats(now time.Time, out []ConnInfo) (RXLimits, []ConnInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for rc := range p.set {
		out = append(out, rc.info(now))
	}
	return p.limits.statsLocked(), out
}

// count is how many passive connections are left, teardown included.
func (p *passiveSet) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.set)
}

// teardownAll sends every connection ev, a teardown event (control
// loop: Close, the host's link down), and says how many there were.
func (p *passiveSet) teardownAll(ev rxEvent) int {
	rx := snapshotSet(&p.mu, p.set)
	for _, rc := range rx {
		p.rxTransition(rc, ev)
	}
	return len(rx)
}

// forceAll destroys every connection left (Close's DrainTimeout ran out):
// a drain that never completes covers nothing any more.
func (p *passiveSet) forceAll() int {
	rx := snapshotSet(&p.mu, p.set)
	for _, rc := range rx {
		p.rxTransition(rc, rxEvForce)
	}
	p.reaper.flush, p.reaper.drain = nil, nil
	return len(rx)
}

// staleScan moves passive connections idle longer than StaleAfter to
// teardown (Linux ipoib_cm_stale_task).
func (p *passiveSet) staleScan(now time.Time) {
	p.reaper.ctr.staleScans.Add(1)
	limit := now.Add(-p.staleAfter).UnixNano()
	var stale []*rxConn
	p.mu.Lock()
	for rc := range p.set {
		if rc.state == rxLive && rc.stamp.Load() < limit {
			stale = append(stale, rc)
		}
	}
	p.mu.Unlock()
	for _, rc := range stale {
		p.reaper.ctr.staleReaped.Add(1)
		p.rxTransition(rc, rxEvStale)
	}
}
