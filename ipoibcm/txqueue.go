package ipoibcm

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/napi"
)

// This file is the TX queue under the flow of txpath.go: the global TX
// credits, the stop and wake of each host reader (readerGate), and each
// reader's batch window (sendWindow, sendWindows).

// txPath is the lower half of the flow host → HCA: the registered buffers
// host frames are sent from, the global TX credits, the one post function
// every send goes through, and the TX completions that give buffers and
// credits back.
//
// Global TX credits (docs/linux.md §6.1): one count of
// sends posted or parked, over the UD QP and every connection. A host
// reader stops reading when the count reaches SendQueueSize-1 and resumes
// when completions bring it down to half, so no per-QP send queue and no
// CQ can overflow, and one stuck peer cannot wedge another's traffic
// forever (the 2008 "never recovers" bug had one stop flag per ring).
// With several host queues the count stays one: each reader claims the
// credits of the frames it read before sending them (claim), so readers
// on different queues never overcommit the send queues between them.
type txPath struct {
	napi *napi.Context // the TX poller; the host reader busy-polls it
	pool *txPool
	ud   hca.QP // the UD QP, where sends without a connection go
	// sendq is Config.SendQueueSize, the credits; stop closes when the
	// interface stops (a stopped reader gives up waiting).
	sendq int
	stop  <-chan struct{}
	// data and offCtr are the data path's and the offloads' counters.
	data   *counters
	offCtr *offloadCounters

	// outstanding counts the credits taken: sends posted or parked.
	outstanding atomic.Int64
	// parkedCredits counts the credits parked frames hold (under
	// neighbourTable.mu); capped by parkedCreditCap so peers that never answer
	// a REQ cannot hold every credit for the CM timeout and stall healthy
	// traffic.
	parkedCredits int
	// claimed counts the credits readers set aside for the frames of the
	// batch in hand (claim); not yet in outstanding.
	claimed atomic.Int64
	// gates are the host readers' stops and wakes, one per host queue.
	gates []*readerGate
	free  []int // handleTX scratch (TX poller)
	// windows are the host readers' batches, posted outside every lock.
	windows sendWindows
	// hostMAC is the host's MAC now, the destination of ICMP answers.
	hostMAC func() frame.MAC

	ctr txPathCounters
}

// txPathCounters count the reader's stops and wakes and the ICMP
// too-big answers it built for the host.
type txPathCounters struct {
	stops, wakes, tooBigSent atomic.Uint64
}

// creditsFree is how many frames a reader may take now: the credits
// neither taken nor claimed by a reader's batch.
func (tx *txPath) creditsFree() int {
	return tx.sendq - int(tx.outstanding.Load()) - int(tx.claimed.Load())
}

// claim sets aside up to want credits for the frames of a batch a reader
// read, which its sends then take out of the claim one by one as they
// enter outstanding (poster.takeClaim); the reader gives what is left
// back with unclaim when the batch ends. It returns how many it set
// aside, fewer when other readers' batches hold the rest. A lone reader
// does not claim (hostReader.claim), and the count is exactly what it was
// without claims.
func (tx *txPath) claim(want int) int {
	for {
		c := tx.claimed.Load()
		n := min(want, tx.sendq-int(tx.outstanding.Load())-int(c))
		if n <= 0 {
			return 0
		}
		if tx.claimed.CompareAndSwap(c, c+int64(n)) {
			return n
		}
	}
}

// unclaim gives back a batch's claim.
func (tx *txPath) unclaim(n int) {
	if n > 0 {
		tx.claimed.Add(int64(-n))
	}
}

// parkedCreditCap is a quarter of the send queue, but never less than
// one neighbour's worth.
func (tx *txPath) parkedCreditCap() int {
	return max(maxParked, tx.sendq/4)
}

// returnCredits gives n credits back and wakes the reader if it stopped
// and the count fell to half. Called by the TX poller and by whoever
// drops a parked frame.
func (tx *txPath) returnCredits(n int) {
	if n == 0 {
		return
	}
	tx.wakeIfResumed(tx.outstanding.Add(int64(-n)))
}

// handOverParked passes a parked frame's credit to the send about to be
// posted for it (post takes one), without waking the reader in between.
func (tx *txPath) handOverParked() { tx.outstanding.Add(-1) }

// wakeIfResumed wakes the stopped readers once the count (left) is down
// to half.
func (tx *txPath) wakeIfResumed(left int64) {
	if left > int64(tx.sendq/2) {
		return
	}
	for _, g := range tx.gates {
		if g.resume() {
			tx.ctr.wakes.Add(1)
		}
	}
}

// waitCredits blocks the reader of g while its queue is stopped, or while
// fewer than reserve credits are free (a super frame the reader may have
// to cut in software needs that many; reserve is at most half the queue,
// where a stopped queue resumes). It returns false when the interface is
// stopping.
func (tx *txPath) waitCredits(g *readerGate, reserve int) bool {
	limit := int64(tx.sendq - max(1, reserve))
	if tx.outstanding.Load()+tx.claimed.Load() < limit {
		return true
	}
	// Reap what has completed before stopping the queue (the reader
	// busy-polls the TX CQ).
	tx.napi.BusyPoll()
	if tx.outstanding.Load()+tx.claimed.Load() < limit {
		return true
	}
	tx.ctr.stops.Add(1)
	return tx.stopQueue(g, stopForCredits)
}

// readerGate is one host reader's stop and wake: stopped says it waits
// for completions, wake is how returnCredits tells it they came.
type readerGate struct {
	stopped atomic.Bool
	wake    chan struct{}
}

func (g *readerGate) init() { g.wake = make(chan struct{}, 1) }

// resume flips a stopped gate back and wakes its reader; it reports
// whether it did (whoever flips stopped owns the resumption).
func (g *readerGate) resume() bool {
	if !g.stopped.Load() || !g.stopped.CompareAndSwap(true, false) {
		return false
	}
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return true
}

// stopReason is what the stopped reader waits for.
//
//go:generate go tool stringer -type=stopReason -linecomment
type stopReason int

const (
	// stopForCredits: outstanding sends at the limit
	stopForCredits stopReason = iota // credits
	// stopForBuffers: every TX pool buffer in flight
	stopForBuffers // buffers
)

// resumable reports whether what the reader stopped for came back: the
// credits fell to half (the level returnCredits wakes at) or a buffer is
// free.
func (tx *txPath) resumable(why stopReason) bool {
	if why == stopForBuffers {
		return tx.pool.available() > 0
	}
	return tx.outstanding.Load() <= int64(tx.sendq/2)
}

// stopQueue stops the reader of g until returnCredits wakes it. It
// returns false when the interface is stopping.
//
// The order is what makes the wake-up impossible to lose: completions that
// land before stopped is set do not wake (nobody is stopped yet), so the
// condition is checked again after the store; completions after it find
// stopped and wake. Whoever flips stopped back to false (the re-check here
// or returnCredits) owns the resumption.
func (tx *txPath) stopQueue(g *readerGate, why stopReason) bool {
	g.stopped.Store(true)
	// A stopped queue waits for completion events: hand re-arming back
	// to the TX poller (after stopped is set, so the poll that returns
	// the credits sees it and wakes us).
	tx.napi.EndBusyPoll()
	if tx.resumable(why) && g.stopped.CompareAndSwap(true, false) {
		return true
	}
	for {
		select {
		case <-g.wake:
			if !g.stopped.Load() {
				return true
			}
		case <-tx.stop:
			return false
		}
	}
}

// sendWindow is the span of one host reader batch. The reader resolves
// each frame under the owners' locks (neighbour table, multicast table)
// and posts after releasing them, so what it resolved (an address handle,
// a connection) must outlive the locks until the batch ends:
//
//   - an address handle taken out of its table is retired here, not
//     destroyed, and destroyed once the batch that may still post with it
//     has ended (as Linux's ipoib_put_ah defers the free past the sends
//     that use it);
//   - whoever changes what the reader decides by (the host took ib0 down,
//     the mode switched) waits with quiesce until the batch that read the
//     old value has ended, so no frame resolved before the change is
//     still in flight after it.
//
// A connection needs nothing of this: the reader reserves its send slot
// (txConn.outstanding) under the neighbour table's lock, and teardown
// (under the same lock) sees the reservation.
type sendWindow struct {
	mu    sync.Mutex
	ended sync.Cond // batches moved
	open  bool
	// batches counts the batches ended.
	batches uint64
	// retired are address handles to release when the open batch ends;
	// spare is the other half of the swap, so leave allocates nothing.
	retired, spare []*retiredAH
	log            *slog.Logger
}

// retiredAH is an address handle retired while batches were open, held
// by each of them: the last to end destroys it.
type retiredAH struct {
	ah   hca.AH
	refs atomic.Int32
}

// release drops one hold, destroying the handle with the last.
func (r *retiredAH) release(log *slog.Logger) {
	if r.refs.Add(-1) == 0 {
		destroyAH(r.ah, log)
	}
}

func (w *sendWindow) init(log *slog.Logger) {
	w.ended.L = &w.mu
	w.log = log
}

// enter opens a batch (host reader).
func (w *sendWindow) enter() {
	w.mu.Lock()
	w.open = true
	w.mu.Unlock()
}

// leave ends the batch (host reader): the address handles retired during
// it are released, and whoever waits in quiesce goes on.
func (w *sendWindow) leave() {
	w.mu.Lock()
	w.open = false
	w.batches++
	dead := w.retired
	w.retired, w.spare = w.spare[:0], dead
	w.ended.Broadcast()
	w.mu.Unlock()
	for k, r := range dead {
		r.release(w.log)
		dead[k] = nil
	}
}

// hold keeps r until the batch open now, if any, ends. A batch that
// opens later cannot have resolved r: its table gave it up before
// retiring it.
func (w *sendWindow) hold(r *retiredAH) {
	w.mu.Lock()
	if w.open {
		r.refs.Add(1)
		w.retired = append(w.retired, r)
	}
	w.mu.Unlock()
}

// quiesce waits until the batch open now, if any, has ended. Never from
// a host reader; it may wait only for a batch, which never waits.
func (w *sendWindow) quiesce() {
	w.mu.Lock()
	for b := w.batches; w.open && w.batches == b; {
		w.ended.Wait()
	}
	w.mu.Unlock()
}

// close releases whatever is still held (Close, the reader stopped).
func (w *sendWindow) close() {
	w.mu.Lock()
	dead := w.retired
	w.retired = nil
	w.mu.Unlock()
	for _, r := range dead {
		r.release(w.log)
	}
}

func destroyAH(ah hca.AH, log *slog.Logger) {
	if err := ah.Destroy(); err != nil && log != nil {
		log.Warn("destroy address handle", "dgid", ah.DGID(), "err", err)
	}
}

// sendWindows are every host reader's windows: whoever retires an address
// handle or changes what the readers decide by deals with all of them.
// Each window has its own lock; none is taken inside another.
type sendWindows struct {
	ws  []*sendWindow
	log *slog.Logger
}

// retire destroys ah, an address handle no table hands out any more, at
// once when no batch is open, else when the last batch open now ends.
func (s *sendWindows) retire(ah hca.AH) {
	r := &retiredAH{ah: ah}
	r.refs.Store(1) // retire's own, so no window destroys it before all hold it
	for _, w := range s.ws {
		w.hold(r)
	}
	r.release(s.log)
}

// quiesce waits until every batch open now has ended (the host took
// ib0 down, the mode switched). A batch opened meanwhile on a window not
// yet visited is waited for too, which costs only that batch.
func (s *sendWindows) quiesce() {
	for _, w := range s.ws {
		w.quiesce()
	}
}

// close releases what every window still holds.
func (s *sendWindows) close() {
	for _, w := range s.ws {
		w.close()
	}
}
