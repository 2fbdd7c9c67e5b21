package core

// Queue is a fixed-capacity FIFO: a QP's send and receive queues, an
// SRQ, the entries of a CQ's Ring. Its slots are preallocated so the data
// path never allocates; popped slots are zeroed to drop references.
type Queue[T any] struct {
	buf  []T
	head int
	n    int
}

// NewQueue makes a queue of capacity slots.
func NewQueue[T any](capacity int) Queue[T] { return Queue[T]{buf: make([]T, capacity)} }

// Len is the number of elements queued.
func (r *Queue[T]) Len() int { return r.n }

// Cap is the number of slots.
func (r *Queue[T]) Cap() int { return len(r.buf) }

// Full reports whether Push would fail.
func (r *Queue[T]) Full() bool { return r.n == len(r.buf) }

// Push appends v; false when the queue is full.
func (r *Queue[T]) Push(v T) bool {
	if r.n == len(r.buf) {
		return false
	}
	i := r.head + r.n
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	r.buf[i] = v
	r.n++
	return true
}

// Peek returns the oldest element; the queue must not be empty.
func (r *Queue[T]) Peek() *T { return &r.buf[r.head] }

// Pop removes the oldest element.
func (r *Queue[T]) Pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.n--
	r.emptied()
	return v, true
}

// emptied starts an empty queue over at slot 0. The order is the same
// either way; what changes is the memory: a queue that is usually empty
// between bursts, as a CQ is, keeps reusing its first slots, which stay in
// the cache, instead of walking through every slot of its capacity (a
// receive CQ sized for 4096 UD receives is over half a megabyte of
// entries, touched one cold line per completion).
func (r *Queue[T]) emptied() {
	if r.n == 0 {
		r.head = 0
	}
}

// Clear empties the queue and drops its references.
func (r *Queue[T]) Clear() {
	clear(r.buf)
	r.head, r.n = 0, 0
}

// PopNewest removes the most recently pushed element.
func (r *Queue[T]) PopNewest() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	i := r.head + r.n - 1
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	v := r.buf[i]
	r.buf[i] = zero
	r.n--
	r.emptied()
	return v, true
}
