package ipoibcm

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// reaper is the control loop's view of passive-connection teardown
// (DESIGN.md "Teardown of a passive connection", kernel-ipoib.md §4.3):
//
//  1. under the RX poll lock, mark the connection dead;
//  2. QP -> Error; wait for LAST_WQE_REACHED (SRQ) and collect such
//     connections on flush; post one drain WR on an errored QP of the
//     batch, whose flush completion lands on the RX CQ behind every
//     earlier completion; only one drain is outstanding;
//  3. when the RX poller sees the drain completion, the control loop
//     destroys every QP it covers.
//
// Without SRQ, step 2 counts the connection's flushed receives to zero.
type reaper struct {
	flush []*rxConn // LAST_WQE seen, waiting for a drain
	drain []*rxConn // covered by the outstanding drain WR

	shuttingDown  bool
	shutdownDone  chan struct{}
	shutdownTimer *time.Timer
}

// reaperCounters are exported through Stats.Reaper.
type reaperCounters struct {
	staleScans, staleReaped, movedToError            atomic.Uint64
	lastWQESeen, drainsPosted, drainsCompleted       atomic.Uint64
	drainPostFailures, reaped, forcedAtStop          atomic.Uint64
	cqErrors, mcastJoins, tooBigSent                 atomic.Uint64
	txStops, txWakes, txConnects, txEstablished      atomic.Uint64
	txConnectFailures, txTeardowns, txDestroyed      atomic.Uint64
	rxAccepted, rxRejectedNoQP, neighRestarts        atomic.Uint64
	neighAged, modeSwitches, lateLastWQE, reresolves atomic.Uint64
	neighEvicted                                     atomic.Uint64
}

// teardownRX starts the teardown of a passive connection (control loop).
// Idempotent: only a live connection moves.
func (i *Interface) teardownRX(rc *rxConn, why string) {
	i.mu.Lock()
	if rc.state != rxLive {
		i.mu.Unlock()
		return
	}
	i.mu.Unlock()
	if !i.mut.SkipDeadFlag {
		// Under the poll lock: no poll that began before is still running,
		// and every later one sees the flag.
		i.rxNAPI.Sync(func() { rc.dead.Store(true) })
	}
	i.mu.Lock()
	rc.state = rxError
	i.mu.Unlock()
	i.rs.movedToError.Add(1)
	i.log.Debug("passive teardown", "peer", rc.peer, "qpn", rc.qp.QPN(), "why", why)
	if err := rc.qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
		i.log.Warn("RX QP to Error", "peer", rc.peer, "err", err)
	}
	if i.mut.SkipDrain {
		i.reapRX(rc)
		return
	}
	if i.srq == nil && rc.recvCount.Load() == 0 {
		i.reapRX(rc)
	}
}

// onLastWQE: the QP's last SRQ WQE has its completion queued (control
// loop). A LAST_WQE for a connection still live means the backend errored
// the QP by itself (or it raced the REP): it is marked dead first.
func (i *Interface) onLastWQE(rc *rxConn) {
	i.mu.Lock()
	st := rc.state
	i.mu.Unlock()
	switch st {
	case rxLive:
		i.rs.lateLastWQE.Add(1)
		if !i.mut.SkipDeadFlag {
			i.rxNAPI.Sync(func() { rc.dead.Store(true) })
		}
	case rxError:
	default:
		return // duplicate, or already reaped under the SkipDrain mutation
	}
	if i.mut.SkipDrain {
		i.reapRX(rc)
		return
	}
	i.mu.Lock()
	rc.state = rxFlush
	i.mu.Unlock()
	i.reaper.flush = append(i.reaper.flush, rc)
	i.startDrain()
}

// startDrain posts the drain WR for every connection on the flush list,
// unless one is already outstanding (the RX CQ has one spare slot).
func (i *Interface) startDrain() {
	r := &i.reaper
	if len(r.drain) > 0 || len(r.flush) == 0 {
		return
	}
	wr := [1]hca.SendWR{{ID: wrDrain, Data: i.drainBuf[:0]}}
	for _, rc := range r.flush {
		if n, err := rc.qp.PostSend(wr[:]); err == nil && n == 1 {
			i.rs.drainsPosted.Add(1)
			r.drain, r.flush = r.flush, r.drain[:0]
			i.mu.Lock()
			for _, d := range r.drain {
				d.state = rxDrain
			}
			i.mu.Unlock()
			return
		}
		i.rs.drainPostFailures.Add(1)
	}
	// No QP of the batch took the drain WR; Close's deadline forces them.
	i.log.Warn("drain WR refused by every flushed QP", "count", len(r.flush))
}

// onDrainDone runs when the RX poller polled the drain completion: every
// connection it covers has no completion left in the RX CQ.
func (i *Interface) onDrainDone() {
	r := &i.reaper
	covered := r.drain
	r.drain = nil
	for _, rc := range covered {
		i.reapRX(rc)
	}
	i.startDrain()
}

// onRingFlushed: a non-SRQ connection's last posted receive completed.
func (i *Interface) onRingFlushed(rc *rxConn) {
	i.mu.Lock()
	st := rc.state
	i.mu.Unlock()
	if st == rxLive {
		// The QP errored without us: mark it dead before reaping.
		if !i.mut.SkipDeadFlag {
			i.rxNAPI.Sync(func() { rc.dead.Store(true) })
		}
	}
	i.reapRX(rc)
}

// reapRX destroys the QP and the CM id (control loop, never the poller).
func (i *Interface) reapRX(rc *rxConn) {
	i.mu.Lock()
	if rc.state == rxDestroyed {
		i.mu.Unlock()
		return
	}
	rc.state = rxDestroyed
	delete(i.rxConns, rc)
	i.releaseRXLocked(rc)
	if i.srq == nil {
		i.nonSRQ--
	}
	i.mu.Unlock()
	if rc.cmConn != nil {
		rc.cmConn.Destroy()
	}
	if err := rc.qp.Destroy(); err != nil {
		i.log.Warn("destroy RX QP", "peer", rc.peer, "err", err)
	}
	i.rs.reaped.Add(1)
	if h := i.hooks.rxReaped; h != nil {
		h(rc)
	}
}

// staleScan moves passive connections idle longer than StaleAfter to
// teardown (Linux ipoib_cm_stale_task).
func (i *Interface) staleScan(now time.Time) {
	i.rs.staleScans.Add(1)
	limit := now.Add(-i.cfg.StaleAfter).UnixNano()
	var stale []*rxConn
	i.mu.Lock()
	for rc := range i.rxConns {
		if rc.state == rxLive && rc.stamp.Load() < limit {
			stale = append(stale, rc)
		}
	}
	i.mu.Unlock()
	for _, rc := range stale {
		i.rs.staleReaped.Add(1)
		i.teardownRX(rc, "stale")
	}
}

// ageNeighbours disconnects the TX connection of neighbours unused for
// sending for NeighbourTimeout. The MAC mapping stays: the host's ARP
// cache still names it, and the next frame rebuilds the connection.
// Neighbours silent in both directions for NeighbourEvictAfter, with
// nothing left that refers to them, are forgotten (evictNeighboursLocked).
func (i *Interface) ageNeighbours(now time.Time) {
	var idle []*txConn
	i.mu.Lock()
	for _, n := range i.neigh.byGID {
		if now.Sub(n.lastUse) < i.cfg.NeighbourTimeout {
			continue
		}
		if n.tx != nil {
			idle = append(idle, n.tx)
			i.detachTXLocked(n.tx, dropTxNeighFlushed)
			i.rs.neighAged.Add(1)
		}
	}
	i.evictNeighboursLocked(now)
	i.mu.Unlock()
	for _, tc := range idle {
		i.teardownTX(tc)
	}
}

// evictNeighboursLocked removes neighbours idle for NeighbourEvictAfter
// that nothing refers to: no TX connection (not even one still closing,
// whose teardown writes to its neighbour), no parked frame, no passive
// connection from the port (its packets reach the host under the
// neighbour's MAC). Their address handle is destroyed and their MAC index
// freed. Without this the table would grow with every peer ever seen.
func (i *Interface) evictNeighboursLocked(now time.Time) {
	var busy map[*neighbour]bool
	var rxPeers map[hca.GID]bool
	for _, n := range i.neigh.byGID {
		if now.Sub(n.idleSince()) < i.cfg.NeighbourEvictAfter || n.tx != nil || n.nParked > 0 {
			continue
		}
		if busy == nil {
			// Built once per pass, and only when some neighbour is
			// idle long enough: most passes allocate nothing.
			busy = make(map[*neighbour]bool, len(i.txConns))
			for tc := range i.txConns {
				busy[tc.neigh] = true
			}
			rxPeers = make(map[hca.GID]bool, len(i.rxConns))
			for rc := range i.rxConns {
				rxPeers[rc.peer.GID()] = true
			}
		}
		if busy[n] || rxPeers[n.gid] {
			continue
		}
		if n.ah != nil {
			if err := n.ah.Destroy(); err != nil {
				i.log.Warn("destroy neighbour AH", "peer", n.hw, "err", err)
			}
			n.ah = nil
		}
		i.neigh.remove(n)
		i.rs.neighEvicted.Add(1)
		i.log.Debug("neighbour evicted", "peer", n.hw, "mac", n.mac, "idle", now.Sub(n.idleSince()))
	}
}

// switchMode (control loop): flush every TX connection, switch, tell the
// host the new MTU (Linux ipoib_set_mode + ipoib_flush_paths). Switching
// to the current mode only retries telling the host, if that failed.
//
// A smaller MTU reaches the host before the engine switches: frames the
// host builds from then on fit the new path, and those it had queued at
// the old MTU are the host's to cut (tap/netstack does) or to have
// answered with ICMP. Switching first would drop, with ICMP, every frame
// read in between: the tail of each running TCP flight, which gVisor's TCP
// then recovers at two segments per retransmission timeout (20 s and more
// in TestModeSwitchDuringTCP). A larger MTU goes the other way round, so
// the host never sends what the engine would still refuse.
func (i *Interface) switchMode(m Mode) error {
	if Mode(i.mode.Load()) == m {
		if i.hostMTUStale {
			return i.tellHostMTU(m, i.MTU())
		}
		return nil
	}
	i.rs.modeSwitches.Add(1)
	newMTU := i.modeMTU(m)
	lowerFirst := newMTU < i.MTU()
	var hostErr error
	if lowerFirst {
		hostErr = i.tellHostMTU(m, newMTU)
	}
	var conns []*txConn
	i.mu.Lock()
	i.mode.Store(int32(m))
	i.mtu.Store(int64(newMTU))
	for tc := range i.txConns {
		conns = append(conns, tc)
	}
	i.mu.Unlock()
	for _, tc := range conns {
		i.teardownTX(tc)
	}
	if !lowerFirst {
		hostErr = i.tellHostMTU(m, newMTU)
	}
	return hostErr
}

// tellHostMTU gives the host mtu, the MTU of mode m (control loop). A failure
// does not undo the switch: connections are already flushed, and a host
// still at the old MTU only costs ICMP frag-needed / packet-too-big for its
// oversize packets (txNeighLocked answers them), whereas switching back
// could fail the same way and leave mode and MTU inconsistent.
func (i *Interface) tellHostMTU(m Mode, mtu int) error {
	if err := i.host.SetMTU(mtu); err != nil {
		i.hostMTUStale = true
		i.log.Warn("mode switched, host MTU not updated", "mode", m, "mtu", mtu, "err", err)
		return fmt.Errorf("%s: %w (mode %s, MTU %d): %w", i.cfg.Name, ErrHostMTUNotUpdated, m, mtu, err)
	}
	i.hostMTUStale = false
	i.log.Info("mode", "mode", m, "mtu", mtu)
	return nil
}

// beginShutdown tears everything down through the normal protocol
// (control loop); done closes when all is reaped or DrainTimeout forced.
func (i *Interface) beginShutdown(done chan struct{}) {
	r := &i.reaper
	r.shuttingDown = true
	r.shutdownDone = done
	r.shutdownTimer = time.NewTimer(i.cfg.DrainTimeout)
	rx, tx := i.snapshotConns()
	for _, rc := range rx {
		i.teardownRX(rc, "stop")
	}
	for _, tc := range tx {
		i.teardownTX(tc)
	}
}

// snapshotConns copies the RX and TX connection sets under mu, so the
// shutdown paths can tear connections down (which takes mu itself and
// removes them from the sets) while walking the copies.
func (i *Interface) snapshotConns() ([]*rxConn, []*txConn) {
	i.mu.Lock()
	defer i.mu.Unlock()
	rx := make([]*rxConn, 0, len(i.rxConns))
	for rc := range i.rxConns {
		rx = append(rx, rc)
	}
	tx := make([]*txConn, 0, len(i.txConns))
	for tc := range i.txConns {
		tx = append(tx, tc)
	}
	return rx, tx
}

// checkShutdown finishes Close once nothing is left.
func (i *Interface) checkShutdown() {
	r := &i.reaper
	if !r.shuttingDown || r.shutdownDone == nil {
		return
	}
	i.mu.Lock()
	left := len(i.rxConns) + len(i.txConns)
	i.mu.Unlock()
	if left == 0 {
		i.finishShutdown()
	}
}

// forceShutdown: the drain did not finish within DrainTimeout (a wedged
// backend, Linux's "RX drain timing out"): destroy what is left.
func (i *Interface) forceShutdown() {
	rx, tx := i.snapshotConns()
	i.log.Warn("drain timed out; forcing", "rx", len(rx), "tx", len(tx))
	for _, rc := range rx {
		i.rxNAPI.Sync(func() { rc.dead.Store(true) })
		i.rs.forcedAtStop.Add(1)
		i.reapRX(rc)
	}
	for _, tc := range tx {
		// Return the credits its unflushed sends hold; late completions
		// then find outstanding at zero and return none.
		if v := tc.outstanding.Swap(0); v > 0 {
			i.returnCredits(int(v))
		}
		i.rs.forcedAtStop.Add(1)
		i.destroyTX(tc)
	}
	i.reaper.flush, i.reaper.drain = nil, nil
	i.finishShutdown()
}

func (i *Interface) finishShutdown() {
	r := &i.reaper
	if r.shutdownTimer != nil {
		r.shutdownTimer.Stop()
		r.shutdownTimer = nil
	}
	if r.shutdownDone != nil {
		close(r.shutdownDone)
		r.shutdownDone = nil
	}
}
