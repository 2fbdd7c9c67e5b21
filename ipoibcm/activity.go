package ipoibcm

import (
	"sync/atomic"
	"time"
)

// activity is when a connection last carried a packet, for 'ipoib show'
// (idle_ms) and the peers view. The data path stores the clock of its
// batch (the RX poller's per-poll clock, the host reader's per-read
// clock), and only when that differs from the stored one, so a
// connection moving millions of packets a second writes the stamp once
// per batch, not once per packet. The passive connection's LRU stamp is
// another thing: it is refreshed every StaleUpdate at most, as Linux's
// (docs/linux.md §4.2), and shows as lru_ms.
type activity struct {
	last atomic.Int64 // unix nanos; 0: never
}

// touch records activity at now (unix nanos).
func (a *activity) touch(now int64) {
	if a.last.Load() != now {
		a.last.Store(now)
	}
}

// idleMS is the time since the last activity in milliseconds, or since
// created when there was none.
func (a *activity) idleMS(now, created time.Time) int64 {
	last := a.last.Load()
	if last == 0 {
		return millisSince(now, created)
	}
	return millisSince(now, time.Unix(0, last))
}
