package cm

import "github.com/ipoibcm/ipoib/hca"

// The CM handles MADs one at a time and is slower than the wire: under a
// REQ flood the GSI receive queue runs dry and the HCA drops whatever
// arrives next, so a peer's one REQ is lost with the flood's. To keep the
// losses fair, received MADs wait in a FIFO per source GID, served round
// robin, while the run goroutine keeps polling between MADs. The backlog
// holds at most 7/8 of the receive queue, so the HCA always has buffers
// posted and the drops happen here, counted as DropBacklog. Up to half the
// queue a source may queue any number (a host opening a thousand
// connections at once); beyond it, a source already holding
// backlogPerSource MADs is refused, so the sources that send the most are
// the ones that lose, and a peer with a handshake or two in flight is
// served within one round of the sources present. With more than
// (7/8 queue)/backlogPerSource flooding sources (112 at the default depth)
// the backlog can still fill and refuse everyone, as the HCA would.
const (
	// backlogPerSource covers what one peer has in flight at once: a REQ
	// or REP, an RTU, a DREQ/DREP per connection, and their retries.
	backlogPerSource = 8
	// backlogServe is how many queued MADs are handled between two polls.
	backlogServe = 4
)

// backlogEntry is one received MAD still in its receive slot.
type backlogEntry struct {
	slot int32
	len  int32
}

// sourceQueue is the FIFO of one source GID.
type sourceQueue struct {
	gid     hca.GID
	entries []backlogEntry // from head on
	head    int
}

func (q *sourceQueue) len() int { return len(q.entries) - q.head }

// backlog is owned by the Manager's run goroutine.
type backlog struct {
	limit    int // receive slots held at most, over all sources
	fair     int // held beyond this, a source gets backlogPerSource
	held     int
	bySource map[hca.GID]*sourceQueue
	// ring holds the sources with entries, in serving order; it never
	// holds more than limit sources, since each holds a slot.
	ring       []*sourceQueue
	head, size int
	free       []*sourceQueue
}

func newBacklog(queueDepth int) backlog {
	limit := max(queueDepth*7/8, 1)
	return backlog{
		limit:    limit,
		fair:     queueDepth / 2,
		bySource: make(map[hca.GID]*sourceQueue),
		ring:     make([]*sourceQueue, limit),
	}
}

// push queues the MAD in slot from src; false means it must be dropped.
func (b *backlog) push(src hca.GID, slot, n int) bool {
	if b.held >= b.limit {
		return false
	}
	q := b.bySource[src]
	if q == nil {
		if k := len(b.free); k > 0 {
			q, b.free = b.free[k-1], b.free[:k-1]
		} else {
			q = new(sourceQueue)
		}
		q.gid, q.entries, q.head = src, q.entries[:0], 0
		b.bySource[src] = q
		b.ring[(b.head+b.size)%len(b.ring)] = q
		b.size++
	}
	if q.len() >= backlogPerSource && b.held >= b.fair {
		return false
	}
	if q.head > 0 && len(q.entries) == cap(q.entries) {
		// Reuse the served prefix, so a source that never empties its
		// queue cannot grow it past what it holds.
		q.entries = q.entries[:copy(q.entries, q.entries[q.head:])]
		q.head = 0
	}
	q.entries = append(q.entries, backlogEntry{slot: int32(slot), len: int32(n)})
	b.held++
	return true
}

// pop takes the oldest MAD of the next source in turn.
func (b *backlog) pop() (src hca.GID, slot, n int, ok bool) {
	if b.size == 0 {
		return src, 0, 0, false
	}
	q := b.ring[b.head]
	b.ring[b.head] = nil
	b.head = (b.head + 1) % len(b.ring)
	b.size--
	e := q.entries[q.head]
	q.head++
	b.held--
	if q.len() > 0 {
		b.ring[(b.head+b.size)%len(b.ring)] = q
		b.size++
	} else {
		delete(b.bySource, q.gid)
		b.free = append(b.free, q)
	}
	return q.gid, int(e.slot), int(e.len), true
}
