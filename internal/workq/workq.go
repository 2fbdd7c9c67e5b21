// Package workq is the hand-off queue between many producers and one
// consumer goroutine that both the engine's control loop (ipoibcm) and the
// soft fabric's callback dispatcher (hca/soft) use: Post never blocks and
// never runs the consumer, so it is safe under a producer's locks and from
// inside a callback; the consumer takes everything queued in one swap and
// runs it in posting order.
//
// The queue is unbounded by design: its producers are bounded elsewhere
// (the engine posts at most a few items per connection or per poll, the
// fabric one per completion event or async event), and a bounded queue
// would have to either block a producer that holds locks or lose an event.
package workq

import "sync"

// Queue is a FIFO of T. The zero value is not ready; use New.
type Queue[T any] struct {
	mu    sync.Mutex
	queue []T
	spare []T // the previous batch's array, reused by the next Post
	wake  chan struct{}
}

// New returns an empty queue.
func New[T any]() *Queue[T] {
	return &Queue[T]{wake: make(chan struct{}, 1)}
}

// Post appends v and wakes the consumer. It never blocks.
func (q *Queue[T]) Post(v T) {
	q.mu.Lock()
	q.queue = append(q.queue, v)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Wake is readable when something may have been posted since the last
// Take. Wake-ups coalesce: one receive can stand for many Posts.
func (q *Queue[T]) Wake() <-chan struct{} { return q.wake }

// Take swaps out everything queued, in posting order. The consumer hands
// the batch back with Recycle once it is done with it.
func (q *Queue[T]) Take() []T {
	q.mu.Lock()
	b := q.queue
	q.queue = q.spare[:0]
	q.spare = nil
	q.mu.Unlock()
	return b
}

// Recycle zeroes batch (so it keeps nothing alive) and keeps its array for
// later Posts.
func (q *Queue[T]) Recycle(batch []T) {
	clear(batch)
	q.mu.Lock()
	if len(q.queue) == 0 && cap(q.queue) < cap(batch) {
		q.queue = batch[:0] // nothing posted meanwhile: reuse it at once
	} else {
		q.spare = batch[:0]
	}
	q.mu.Unlock()
}
