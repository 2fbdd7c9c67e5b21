package core

import (
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func TestQueuePopNewestWraps(t *testing.T) {
	r := NewQueue[int](3)
	for _, v := range []int{1, 2, 3} {
		r.Push(v)
	}
	r.Pop()   // head moves to slot 1
	r.Push(4) // lands in slot 0: the ring has wrapped
	var got []int
	for r.Len() > 0 {
		v, _ := r.PopNewest()
		got = append(got, v)
	}
	if !slices.Equal(got, []int{4, 3, 2}) {
		t.Fatalf("PopNewest order %v, want [4 3 2]", got)
	}
	if _, ok := r.PopNewest(); ok {
		t.Fatal("PopNewest on an empty ring succeeded")
	}
}

// An emptied queue and ring start over at slot 0, so a CQ that is polled
// empty keeps reusing its first (cached) slots; the order is unchanged.
func TestQueueEmptiedRestartsAtZero(t *testing.T) {
	r := NewQueue[int](4)
	r.Push(1)
	r.Push(2)
	r.Pop()
	if r.head != 1 {
		t.Fatalf("head %d after one pop of two, want 1", r.head)
	}
	r.Pop()
	if r.head != 0 || r.Len() != 0 {
		t.Fatalf("emptied by Pop: head %d len %d, want 0 0", r.head, r.Len())
	}
	r.Push(3)
	r.Push(4)
	r.PopNewest()
	r.PopNewest()
	if r.head != 0 {
		t.Fatalf("emptied by PopNewest: head %d", r.head)
	}

	ring := NewRing[*fakeQP](4)
	into := make([]hca.WC, 4)
	for round := range 3 {
		for i := range 3 {
			ring.Push(Entry[*fakeQP]{WC: hca.WC{ID: uint64(10*round + i)}})
		}
		if n, _ := ring.Poll(into[:1]); n != 1 || into[0].ID != uint64(10*round) || ring.q.head != 1 {
			t.Fatalf("round %d: partial poll %d %+v head %d", round, n, into[0], ring.q.head)
		}
		if n, _ := ring.Poll(into); n != 2 || into[0].ID != uint64(10*round+1) || into[1].ID != uint64(10*round+2) {
			t.Fatalf("round %d: poll %d %+v", round, n, into[:2])
		}
		if ring.q.head != 0 || ring.Len() != 0 {
			t.Fatalf("round %d: polled empty, head %d len %d", round, ring.q.head, ring.Len())
		}
	}
}
