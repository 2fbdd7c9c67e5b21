package capture

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// Ring keeps the last records (messages and events) in memory, bounded in
// count and bytes, for a file written only if something goes wrong (ipoib
// soak --capture). Trigger marks the moment: the ring then records half
// its size more and freezes, so the file shows what led up to the
// failure and what followed.
type Ring struct {
	filter   Filter
	maxRecs  int
	maxBytes int

	mu        sync.Mutex
	recs      []record // circular, len(recs) <= maxRecs
	head      int      // index of the oldest record when full
	bytes     int
	evicted   uint64
	triggered bool
	postLeft  int
	frozen    bool
}

// NewRing returns a ring of at most maxRecords records and maxBytes bytes
// of tapped data.
func NewRing(f Filter, maxRecords, maxBytes int) *Ring {
	maxRecords = max(maxRecords, 16)
	return &Ring{filter: f, maxRecs: maxRecords, maxBytes: max(maxBytes, 1<<20)}
}

// Message implements Sink.
func (g *Ring) Message(m *soft.Message) {
	if !g.filter.passMessage(m) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.frozen {
		return
	}
	g.add(messageRecord(m, time.Now()))
}

// Datagram implements Sink.
func (g *Ring) Datagram(src, dst netip.AddrPort, pkt []byte) {
	if !g.filter.passDatagram(pkt) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.frozen {
		return
	}
	g.add(datagramRecord(src, dst, pkt, time.Now()))
}

// Event implements Sink.
func (g *Ring) Event(host string, e *ipoibcm.Event) {
	if !g.filter.passEvent(host, e) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.frozen {
		return
	}
	g.add(eventRecord(host, e))
}

// add appends r, evicting the oldest records past either bound (under mu).
func (g *Ring) add(r record) {
	if g.triggered {
		if g.postLeft == 0 {
			g.frozen = true
			return
		}
		g.postLeft--
	}
	g.bytes += r.size()
	if len(g.recs) < g.maxRecs {
		g.recs = append(g.recs, r)
	} else {
		g.bytes -= g.recs[g.head].size()
		g.recs[g.head] = r
		g.head = (g.head + 1) % len(g.recs)
		g.evicted++
	}
	for g.bytes > g.maxBytes && g.len() > 1 {
		g.dropOldest()
	}
}

func (g *Ring) len() int { return len(g.recs) }

// dropOldest removes the oldest record by compacting (rare: only when the
// byte bound bites before the count bound).
func (g *Ring) dropOldest() {
	ordered := g.ordered()
	g.bytes -= ordered[0].size()
	ordered[0] = record{}
	g.recs = append(g.recs[:0:0], ordered[1:]...)
	g.head = 0
	g.evicted++
}

// ordered returns the records oldest first (under mu).
func (g *Ring) ordered() []record {
	if len(g.recs) < g.maxRecs || g.head == 0 {
		return g.recs
	}
	out := make([]record, 0, len(g.recs))
	out = append(out, g.recs[g.head:]...)
	return append(out, g.recs[:g.head]...)
}

// Trigger records note as an event at this moment and starts the
// post-trigger count; later triggers only add their note.
func (g *Ring) Trigger(note string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.frozen {
		return
	}
	if !g.triggered {
		g.triggered = true
		g.postLeft = g.maxRecs / 2
	}
	g.add(record{kind: recNote, at: time.Now(), text: note})
}

// Triggered reports whether Trigger was called.
func (g *Ring) Triggered() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.triggered
}

// WriteTo writes the ring as a pcapng file, oldest record first, and
// returns the bytes written.
func (g *Ring) WriteTo(w io.Writer) (int64, error) {
	g.mu.Lock()
	recs := append([]record(nil), g.ordered()...)
	evicted := g.evicted
	g.mu.Unlock()
	cw := &countingWriter{w: w}
	bw := bufio.NewWriterSize(cw, 256<<10)
	fr, err := newFramer(bw)
	if err != nil {
		return cw.n, err
	}
	if evicted > 0 && len(recs) > 0 {
		note := record{kind: recNote, at: recs[0].at,
			text: fmt.Sprintf("capture ring: %d older records not kept (ring of %d records, %d bytes)", evicted, g.maxRecs, g.maxBytes)}
		if err := fr.write(&note); err != nil {
			return cw.n, err
		}
	}
	for k := range recs {
		if err := fr.write(&recs[k]); err != nil {
			return cw.n, err
		}
	}
	err = bw.Flush()
	return cw.n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
