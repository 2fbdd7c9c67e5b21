package workq

import (
	"sync"
	"testing"
)

func TestOrderAndCoalescedWake(t *testing.T) {
	q := New[int]()
	for v := range 5 {
		q.Post(v)
	}
	select {
	case <-q.Wake():
	default:
		t.Fatal("no wake-up after Post")
	}
	select {
	case <-q.Wake():
		t.Fatal("five Posts left more than one wake-up")
	default:
	}
	b := q.Take()
	if len(b) != 5 {
		t.Fatalf("took %d items, want 5", len(b))
	}
	for k, v := range b {
		if v != k {
			t.Fatalf("item %d is %d: order lost", k, v)
		}
	}
	q.Recycle(b)
	if got := q.Take(); len(got) != 0 {
		t.Fatalf("second Take returned %v, want nothing", got)
	}
}

func TestRecycleClearsAndReuses(t *testing.T) {
	q := New[*int]()
	x := 1
	q.Post(&x)
	b := q.Take()
	q.Recycle(b)
	if b[0] != nil {
		t.Fatal("Recycle kept a reference to a taken item")
	}
	q.Post(&x)
	b2 := q.Take()
	if &b2[0] != &b[0] {
		t.Error("the recycled array was not reused")
	}
}

// TestConcurrentPosts: every item of many producers reaches the consumer
// exactly once, each producer's in its order.
func TestConcurrentPosts(t *testing.T) {
	const producers, per = 4, 1000
	type item struct{ p, n int }
	q := New[item]()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range per {
				q.Post(item{p, n})
			}
		}()
	}
	next := make([]int, producers)
	got := 0
	for got < producers*per {
		<-q.Wake()
		b := q.Take()
		for _, it := range b {
			if it.n != next[it.p] {
				t.Fatalf("producer %d: got item %d, want %d", it.p, it.n, next[it.p])
			}
			next[it.p]++
			got++
		}
		q.Recycle(b)
	}
	wg.Wait()
	if rest := q.Take(); len(rest) != 0 {
		t.Fatalf("%d items left over", len(rest))
	}
}
