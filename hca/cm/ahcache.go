package cm

import (
	"errors"
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// maxCachedAHs bounds the GSI address-handle cache. It is 4x the default
// GSI send queue, which is what makes eviction safe (see ahCache.evict).
const maxCachedAHs = 4096

// ahEntry is one cached address handle, linked into the LRU list.
type ahEntry struct {
	gid        hca.GID
	ah         hca.AH
	prev, next *ahEntry
	// lastSend is the sequence number of the last GSI send posted with
	// this handle (0: none yet).
	lastSend uint64
}

// ahCache holds the GSI QP's address handles by destination GID, least
// recently used out first once it holds limit. Without a bound a long-lived
// Manager keeps one handle for every peer it ever talked to.
//
// A handle must outlive the sends posted with it. GSI sends complete in
// posting order (one UD send queue), so counting posted and completed sends
// tells whether an entry's last send is done: an entry is destroyed only
// then. With limit above the send-queue depth the least recently used entry
// always qualifies: at least limit-1 sends were posted after its last one,
// and at most QueueDepth can be outstanding.
//
// Guarded by Manager.mu.
type ahCache struct {
	limit int
	byGID map[hca.GID]*ahEntry
	// lru is the sentinel of a circular list: lru.next is the most
	// recently used entry, lru.prev the least.
	lru       ahEntry
	posted    uint64 // GSI sends posted
	completed uint64 // GSI send completions polled
	evicted   uint64
	// destroyFailures counts evicted handles the backend refused to
	// destroy; nothing more can be done with them.
	destroyFailures uint64
}

func newAHCache(limit int) ahCache {
	return ahCache{limit: max(limit, 1), byGID: make(map[hca.GID]*ahEntry)}
}

// initList links the sentinel; done lazily because ahCache is stored by value
// (the sentinel's address is only stable once it is in the Manager).
func (c *ahCache) initList() {
	if c.lru.next == nil {
		c.lru.next, c.lru.prev = &c.lru, &c.lru
	}
}

func (c *ahCache) len() int { return len(c.byGID) }

// lookup returns the entry for dgid, marked most recently used, or nil.
func (c *ahCache) lookup(dgid hca.GID) *ahEntry {
	e := c.byGID[dgid]
	if e != nil {
		c.unlink(e)
		c.pushFront(e)
	}
	return e
}

// insert caches ah for dgid (not cached yet) as the most recently used
// entry, evicting the least recently used ones beyond the limit.
func (c *ahCache) insert(dgid hca.GID, ah hca.AH) *ahEntry {
	c.initList()
	e := &ahEntry{gid: dgid, ah: ah}
	c.byGID[dgid] = e
	c.pushFront(e)
	c.evict()
	return e
}

// sent records a send posted with e.
func (c *ahCache) sent(e *ahEntry) {
	c.posted++
	e.lastSend = c.posted
}

// sendDone records one polled send completion (any status: a flushed
// send is finished with its handle too).
func (c *ahCache) sendDone() {
	if c.completed < c.posted {
		c.completed++
	}
}

// evict destroys least recently used entries while the cache is over its
// limit and their sends have completed; an entry with a send in flight
// stops the eviction until a later insert (the cache then briefly holds
// more than limit).
func (c *ahCache) evict() {
	for len(c.byGID) > c.limit {
		e := c.lru.prev
		if e == &c.lru || e.lastSend > c.completed {
			return
		}
		c.unlink(e)
		delete(c.byGID, e.gid)
		c.evicted++
		if err := e.ah.Destroy(); err != nil {
			c.destroyFailures++
		}
	}
}

// destroyAll destroys every handle (Manager close).
func (c *ahCache) destroyAll() error {
	var errs []error
	for g, e := range c.byGID {
		if err := e.ah.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("address handle for %s: %w", g, err))
		}
		delete(c.byGID, g)
	}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return errors.Join(errs...)
}

func (c *ahCache) unlink(e *ahEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (c *ahCache) pushFront(e *ahEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}
