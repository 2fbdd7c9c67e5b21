package ipoibcm

import (
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// TestTXPoolOrder: take hands out the most recently given back buffers
// first (the ones still in the cache), and giving back what take handed
// out, used or not, restores the order.
func TestTXPoolOrder(t *testing.T) {
	fab := soft.NewFabric(soft.Config{Seed: 1})
	defer fab.Close()
	dev, err := fab.NewDevice("hca0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newTXPool(dev, 6, 64)
	if err != nil {
		t.Fatal(err)
	}
	idx := make([]int, 4)
	if n := p.take(idx); n != 4 || !slices.Equal(idx, []int{0, 1, 2, 3}) {
		t.Fatalf("first take: %d buffers %v, want [0 1 2 3]", n, idx[:n])
	}
	// Buffer 0 went out and came back; 1..3 were not used.
	p.put(idx[1:]...)
	p.put1(idx[0])
	if n := p.take(idx); n != 4 || !slices.Equal(idx, []int{0, 1, 2, 3}) {
		t.Fatalf("after giving back: %d buffers %v, want the same, most recent first", n, idx[:n])
	}
	p.put(idx...)
	if n := p.take(idx[:1]); n != 1 || idx[0] != 0 {
		t.Fatalf("take after a full put: buffer %d, want 0", idx[0])
	}
	if got := p.available(); got != 5 {
		t.Fatalf("%d free, want 5", got)
	}
}
