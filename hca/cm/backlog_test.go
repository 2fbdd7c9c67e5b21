package cm

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func backlogGID(n int) hca.GID {
	var g hca.GID
	g[0], g[14], g[15] = 0xfe, byte(n>>8), byte(n)
	return g
}

// TestBacklogFairUnderFlood: a few sources that send without pause fill
// the backlog to the fair share and no further, so a peer with one MAD is
// queued and served within one round of the sources.
func TestBacklogFairUnderFlood(t *testing.T) {
	b := newBacklog(1024)
	const flooders = 64
	slot, refused := 0, 0
	for round := 0; round < 100; round++ {
		for s := 0; s < flooders; s++ {
			if b.push(backlogGID(s), slot%1024, MADSize) {
				slot++
			} else {
				refused++
			}
		}
	}
	if b.held > b.limit || b.held < b.fair {
		t.Fatalf("held %d: want between the fair share %d and the limit %d", b.held, b.fair, b.limit)
	}
	if refused == 0 {
		t.Fatal("the flood was never refused")
	}
	peer := backlogGID(1000)
	if !b.push(peer, 7, MADSize) {
		t.Fatalf("the peer's MAD was refused with %d held", b.held)
	}
	for i := 0; i <= flooders; i++ {
		src, s, n, ok := b.pop()
		if !ok {
			t.Fatal("backlog empty too early")
		}
		if src == peer {
			if s != 7 || n != MADSize {
				t.Fatalf("peer's entry came back as slot %d len %d", s, n)
			}
			return
		}
	}
	t.Fatalf("the peer was not served within one round of %d sources", flooders)
}

// TestBacklogBurstFromOneSource: below the fair share a single source may
// queue a burst (one host opening many connections at once), in order.
func TestBacklogBurstFromOneSource(t *testing.T) {
	b := newBacklog(1024)
	src := backlogGID(1)
	for i := 0; i < b.fair; i++ {
		if !b.push(src, i, i) {
			t.Fatalf("MAD %d of a burst refused below the fair share", i)
		}
	}
	if b.push(src, 0, 0) {
		t.Fatal("a source above its share was not refused past the fair share")
	}
	for i := 0; i < b.fair; i++ {
		_, s, _, ok := b.pop()
		if !ok || s != i {
			t.Fatalf("pop %d: slot %d ok %v, want FIFO order", i, s, ok)
		}
	}
	if _, _, _, ok := b.pop(); ok || b.held != 0 || len(b.bySource) != 0 {
		t.Fatalf("not empty after serving everything: held %d sources %d", b.held, len(b.bySource))
	}
}

// TestBacklogBoundedForASourceThatNeverEmpties: a source kept non-empty
// forever does not grow its queue beyond what it holds.
func TestBacklogBoundedForASourceThatNeverEmpties(t *testing.T) {
	b := newBacklog(64)
	src := backlogGID(1)
	b.push(src, 0, 0)
	for i := 0; i < 100000; i++ {
		b.push(src, i, 0)
		b.pop()
	}
	if q := b.bySource[src]; q == nil || cap(q.entries) > 2*b.limit {
		t.Fatalf("queue of a never-empty source grew to %d", cap(q.entries))
	}
}
