package soft

import "sync"

// maxInlineFires bounds the completion events one holder of the fabric lock
// delivers inline. One RC send fires at most two CQs (the sender's send CQ
// and the responder's receive CQ); a batch across a few QPs or a multicast
// fan-out may fire more, and the excess goes to the dispatcher.
const maxInlineFires = 8

// fabricLock is the fabric lock. Besides mutual exclusion it collects the
// completion events of CQs created with hca.CQConfig.InlineCompletion that
// fired while it was held, and delivers them when the holder unlocks: on
// the goroutine that caused them (a poster, the scheduler, a verb called
// from a handler) and after every backend lock is released, which is what
// the contract promises such handlers. Delivering here instead of through
// the dispatcher saves a goroutine wake-up per completion event on the
// data path.
type fabricLock struct {
	sync.Mutex
	pending [maxInlineFires]*cq
	n       int
}

// deferFire queues c's completion event for Unlock; under the lock. It
// reports false when the batch is full and the caller must dispatch.
func (l *fabricLock) deferFire(c *cq) bool {
	for _, p := range l.pending[:l.n] {
		if p == c {
			return true // one event per arm; the CQ cannot fire twice
		}
	}
	if l.n == len(l.pending) {
		return false
	}
	l.pending[l.n] = c
	l.n++
	return true
}

// Unlock releases the lock, then delivers the completion events collected
// while it was held.
func (l *fabricLock) Unlock() {
	if l.n == 0 {
		l.Mutex.Unlock()
		return
	}
	var fire [maxInlineFires]*cq
	n := copy(fire[:], l.pending[:l.n])
	clear(l.pending[:l.n])
	l.n = 0
	l.Mutex.Unlock()
	for _, c := range fire[:n] {
		c.fireCompletion()
	}
}
