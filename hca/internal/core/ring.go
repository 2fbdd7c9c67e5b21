package core

import "github.com/ipoibcm/ipoib/hca"

// QP is what a Ring needs of a backend's QP: identity, and whether it has
// been destroyed.
type QP interface {
	comparable
	Destroyed() bool
}

// Entry is one completion with the QP it belongs to (the zero Q for none):
// Poll counts completions of QPs destroyed meanwhile, and a backend that
// purges a destroyed QP's completions finds them by it. The consumer sees
// only WC.
type Entry[Q QP] struct {
	WC hca.WC
	QP Q
}

// Ring is a CQ's fixed ring of completions, oldest first. It has no lock:
// the backend's CQ lock guards it, so that Poll never waits on a
// backend's send or receive path.
type Ring[Q QP] struct {
	slots   []Entry[Q]
	head, n int
}

// NewRing makes a ring of size entries.
func NewRing[Q QP](size int) Ring[Q] { return Ring[Q]{slots: make([]Entry[Q], size)} }

// Len is the number of completions in the ring.
func (r *Ring[Q]) Len() int { return r.n }

// Push appends e. It reports false when the ring is full: the completion
// is lost, and the backend raises CQ_ERR, as a hardware CQ overrun does.
func (r *Ring[Q]) Push(e Entry[Q]) bool {
	if r.n == len(r.slots) {
		return false
	}
	i := r.head + r.n
	if i >= len(r.slots) {
		i -= len(r.slots)
	}
	r.slots[i] = e
	r.n++
	return true
}

// Poll moves up to len(into) completions out of the ring, oldest first,
// and returns how many, and how many of those belong to QPs destroyed
// meanwhile (IBTA permits returning them, rxe does: a consumer that
// drains before destroying never sees one).
func (r *Ring[Q]) Poll(into []hca.WC) (n int, afterDestroy uint64) {
	var none Q
	n = min(len(into), r.n)
	for i := range n {
		e := &r.slots[r.head]
		into[i] = e.WC
		if e.QP != none && e.QP.Destroyed() {
			afterDestroy++
		}
		*e = Entry[Q]{} // drop the context and QP references
		r.head++
		if r.head == len(r.slots) {
			r.head = 0
		}
	}
	r.n -= n
	return n, afterDestroy
}

// Clear empties the ring and drops its references.
func (r *Ring[Q]) Clear() {
	clear(r.slots)
	r.head, r.n = 0, 0
}

// Purge removes q's completions, keeping the others in order, and
// returns how many it removed.
func (r *Ring[Q]) Purge(q Q) int {
	at := func(i int) *Entry[Q] { return &r.slots[(r.head+i)%len(r.slots)] }
	w := 0
	for i := range r.n {
		if e := *at(i); e.QP != q {
			*at(w) = e
			w++
		}
	}
	for i := w; i < r.n; i++ {
		*at(i) = Entry[Q]{}
	}
	removed := r.n - w
	r.n = w
	return removed
}
