package core

import (
	"slices"
	"testing"
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
