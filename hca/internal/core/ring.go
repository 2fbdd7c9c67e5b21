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
	q Queue[Entry[Q]]
}

// NewRing makes a ring of size entries.
func NewRing[Q QP](size int) Ring[Q] { return Ring[Q]{q: NewQueue[Entry[Q]](size)} }

// Len is the number of completions in the ring.
func (r *Ring[Q]) Len() int { return r.q.Len() }

// Push appends e. It reports false when the ring is full: the completion
// is lost, and the backend raises CQ_ERR, as a hardware CQ overrun does.
func (r *Ring[Q]) Push(e Entry[Q]) bool { return r.q.Push(e) }

// Poll moves up to len(into) completions out of the ring, oldest first,
// and returns how many, and how many of those belong to QPs destroyed
// meanwhile (IBTA permits returning them, rxe does: a consumer that
// drains before destroying never sees one).
func (r *Ring[Q]) Poll(into []hca.WC) (n int, afterDestroy uint64) {
	var none Q
	q := &r.q
	n = min(len(into), q.n)
	for i := range n {
		// In place rather than through Pop: a copy of the entry less
		// per completion.
		e := &q.buf[q.head]
		into[i] = e.WC
		if e.QP != none && e.QP.Destroyed() {
			afterDestroy++
		}
		*e = Entry[Q]{}
		if q.head++; q.head == len(q.buf) {
			q.head = 0
		}
	}
	q.n -= n
	q.emptied()
	return n, afterDestroy
}

// Clear empties the ring and drops its references.
func (r *Ring[Q]) Clear() { r.q.Clear() }

// Purge removes q's completions, keeping the others in order, and
// returns how many it removed.
func (r *Ring[Q]) Purge(qp Q) int {
	n := r.q.Len()
	for range n {
		if e, _ := r.q.Pop(); e.QP != qp {
			r.q.Push(e)
		}
	}
	return n - r.q.Len()
}
