package cm

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// fakeAH records its destruction.
type fakeAH struct {
	gid       hca.GID
	destroyed bool
}

func (a *fakeAH) DGID() hca.GID { return a.gid }
func (a *fakeAH) Destroy() error {
	if a.destroyed {
		return fmt.Errorf("fake AH %s: %w", a.gid, hca.ErrDestroyed)
	}
	a.destroyed = true
	return nil
}

func gidN(k int) hca.GID {
	var g hca.GID
	g[0], g[1], g[15] = 0xfe, 0x80, byte(k)
	g[14] = byte(k >> 8)
	return g
}

// cachedGIDs lists the cache from most to least recently used.
func cachedGIDs(c *ahCache) []hca.GID {
	var out []hca.GID
	for e := c.lru.next; e != &c.lru; e = e.next {
		out = append(out, e.gid)
	}
	return out
}

// The cache keeps the limit most recently used handles and destroys the
// others, but never one whose last send has not completed.
func TestAHCacheEvictsLeastRecentlyUsedAfterItsSends(t *testing.T) {
	c := newAHCache(3)
	ahs := map[int]*fakeAH{}
	use := func(k int) {
		e := c.lookup(gidN(k))
		if e == nil {
			ahs[k] = &fakeAH{gid: gidN(k)}
			e = c.insert(gidN(k), ahs[k])
		}
		c.sent(e)
	}
	use(1)
	use(2)
	use(3)
	// Sends 1..3 are in flight: a fourth handle cannot evict any of them.
	use(4)
	if c.len() != 4 || ahs[1].destroyed {
		t.Fatalf("evicted a handle with a send in flight: len %d, 1 destroyed %v", c.len(), ahs[1].destroyed)
	}
	for range 4 {
		c.sendDone()
	}
	use(2) // 2 is now recent; 1 is the least recently used
	use(5)
	if !ahs[1].destroyed || ahs[2].destroyed {
		t.Fatalf("LRU order: 1 destroyed %v, 2 destroyed %v", ahs[1].destroyed, ahs[2].destroyed)
	}
	// Every send has completed: the insert evicts down to the limit.
	if got, want := cachedGIDs(&c), []hca.GID{gidN(5), gidN(2), gidN(4)}; !slices.Equal(got, want) || !ahs[3].destroyed {
		t.Fatalf("cache %v, want %v; 3 destroyed %v", got, want, ahs[3].destroyed)
	}
	for range 2 {
		c.sendDone()
	}
	use(6)
	if got, want := cachedGIDs(&c), []hca.GID{gidN(6), gidN(5), gidN(2)}; !slices.Equal(got, want) {
		t.Fatalf("cache %v, want %v", got, want)
	}
	for _, k := range []int{1, 3, 4} {
		if !ahs[k].destroyed {
			t.Fatalf("evicted handle %d not destroyed", k)
		}
	}
	if c.evicted != 3 || c.destroyFailures != 0 {
		t.Fatalf("evicted %d, destroy failures %d", c.evicted, c.destroyFailures)
	}
	if err := c.destroyAll(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{2, 5, 6} {
		if !ahs[k].destroyed {
			t.Fatalf("handle %d left after destroyAll", k)
		}
	}
	if c.len() != 0 || c.lru.next != &c.lru {
		t.Fatal("cache not empty after destroyAll")
	}
}

// A Manager that talks to many peers holds a bounded number of address
// handles on the device, the most recent ones.
func TestManagerAddressHandlesBounded(t *testing.T) {
	f := newTestFabric(t, soft.Faults{})
	n := newNode(t, f, "cm-ah", testOptions(3))
	const limit, peers = 4, 12
	n.m.mu.Lock()
	n.m.ahs.limit = limit
	n.m.mu.Unlock()
	base := f.Stats().AHs
	for k := range peers {
		n.m.mu.Lock()
		err := n.m.sendRaw(n.m.scratch[:], MsgDREQ, gidN(100+k), hca.PKeyDefault)
		posted := n.m.ahs.posted
		n.m.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		waitSendsCompleted(t, n.m, posted)
	}
	if got := f.Stats().AHs - base; got != limit {
		t.Fatalf("%d address handles live on the device after %d peers, want %d", got, peers, limit)
	}
	n.m.mu.Lock()
	got, evicted := cachedGIDs(&n.m.ahs), n.m.ahs.evicted
	n.m.mu.Unlock()
	want := []hca.GID{gidN(111), gidN(110), gidN(109), gidN(108)}
	if !slices.Equal(got, want) || evicted != peers-limit {
		t.Fatalf("cached %v (evicted %d), want %v", got, evicted, want)
	}
	// A cached peer is reused, not re-created.
	n.m.mu.Lock()
	err := n.m.sendRaw(n.m.scratch[:], MsgDREQ, gidN(108), hca.PKeyDefault)
	n.m.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Stats().AHs - base; got != limit {
		t.Fatalf("reuse created a handle: %d live", got)
	}
	n.m.Close()
	if got := f.Stats().AHs; got != 0 {
		t.Fatalf("%d address handles left after Close", got)
	}
}

// waitSendsCompleted waits until the Manager's goroutine has polled the
// completions of the first posted GSI sends. The Manager has no hook for
// it, so the counter is observed; the goroutine only needs to be scheduled.
func waitSendsCompleted(t *testing.T, m *Manager, posted uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		done := m.ahs.completed >= posted
		m.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GSI send %d never completed", posted)
		}
		runtime.Gosched()
	}
}
