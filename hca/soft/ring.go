package soft

// ring is a fixed-capacity FIFO. Its slots are preallocated so the data
// path never allocates; popped slots are zeroed to drop references.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func newRing[T any](capacity int) ring[T] { return ring[T]{buf: make([]T, capacity)} }

func (r *ring[T]) len() int   { return r.n }
func (r *ring[T]) full() bool { return r.n == len(r.buf) }

func (r *ring[T]) push(v T) bool {
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

// peek returns the oldest element; the ring must not be empty.
func (r *ring[T]) peek() *T { return &r.buf[r.head] }

func (r *ring[T]) pop() (T, bool) {
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
	return v, true
}

func (r *ring[T]) clear() {
	for r.n > 0 {
		r.pop()
	}
}

// popNewest removes the most recently pushed element.
func (r *ring[T]) popNewest() (T, bool) {
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
	return v, true
}
