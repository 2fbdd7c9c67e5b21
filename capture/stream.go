package capture

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// DefaultBudget is the bytes a Stream may hold queued (records and their
// data) before its writer catches up; past it records are dropped and
// counted. 8 MiB is a quarter second of a writer's speed, and keeps a
// capture's memory (the queue, its spare, the garbage collector's
// headroom) within TestMillionPacketsBoundedRSS's bound.
const DefaultBudget = 8 << 20

// StreamConfig configures a Stream.
type StreamConfig struct {
	Filter Filter
	// Budget bounds the bytes queued for the writer (DefaultBudget if 0).
	Budget int
	// MaxPackets stops the file at this many packets (0: no limit), as
	// tcpdump -c does: packet blocks of either interface, RoCEv2 frames
	// and event records alike, which is what tshark lists. An RC message
	// is several frames and its ACK, so the last message may be cut. Done
	// closes when the file holds them.
	MaxPackets uint64
}

// Stream writes a live capture to an io.Writer from its own goroutine.
type Stream struct {
	cfg StreamConfig
	fr  *framer
	bw  *bufio.Writer

	mu       sync.Mutex
	queue    []record
	spare    []record
	queued   int // bytes in queue
	accepted uint64
	dropped  uint64
	noted    uint64 // drops already reported in the file
	closed   bool
	wake     chan struct{}

	done     chan struct{} // MaxPackets written
	doneOnce sync.Once
	stopped  chan struct{} // writer goroutine gone
	err      error         // first write error, under mu
}

// NewStream writes the pcapng header to w and starts the writer.
func NewStream(w io.Writer, cfg StreamConfig) (*Stream, error) {
	if cfg.Budget <= 0 {
		cfg.Budget = DefaultBudget
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	fr, err := newFramer(bw)
	if err != nil {
		return nil, err
	}
	fr.limit = cfg.MaxPackets
	s := &Stream{cfg: cfg, fr: fr, bw: bw, wake: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go s.run()
	return s, nil
}

// Message implements Sink: copy, queue, return.
func (s *Stream) Message(m *soft.Message) {
	if s.cfg.Filter.passMessage(m) {
		s.admit(len(m.Data), func() record { return messageRecord(m, time.Now()) })
	}
}

// Datagram implements Sink.
func (s *Stream) Datagram(src, dst netip.AddrPort, pkt []byte) {
	if s.cfg.Filter.passDatagram(pkt) {
		s.admit(len(pkt), func() record { return datagramRecord(src, dst, pkt, time.Now()) })
	}
}

// admit queues the record build makes, of n data bytes, if the budget
// allows; a record over budget is dropped and counted. Every message is
// at least one packet, so past MaxPackets messages nothing more can fit
// in the file and nothing is queued.
func (s *Stream) admit(n int, build func() record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.cfg.MaxPackets > 0 && s.accepted >= s.cfg.MaxPackets {
		return
	}
	if s.queued+n+recordOverhead > s.cfg.Budget {
		s.dropped++
		return
	}
	s.push(build())
	s.accepted++
}

// Event implements Sink.
func (s *Stream) Event(host string, e *ipoibcm.Event) {
	if !s.cfg.Filter.passEvent(host, e) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	r := eventRecord(host, e)
	if s.queued+r.size() > s.cfg.Budget {
		s.dropped++
		return
	}
	s.push(r)
}

// push queues r and wakes the writer (under mu).
func (s *Stream) push(r record) {
	s.queue = append(s.queue, r)
	s.queued += r.size()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Backlog is the bytes queued for the writer now, at most the budget.
func (s *Stream) Backlog() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// Done closes when the file holds MaxPackets packets.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Counts returns the messages recorded and the records dropped so far.
func (s *Stream) Counts() (recorded, dropped uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.dropped
}

func (s *Stream) run() {
	defer close(s.stopped)
	for {
		<-s.wake
		s.mu.Lock()
		batch := s.queue
		s.queue, s.spare = s.spare[:0], nil
		s.queued = 0
		closed := s.closed
		newDrops := s.dropped - s.noted
		s.noted = s.dropped
		s.mu.Unlock()
		var err error
		if newDrops > 0 {
			err = s.fr.write(&record{kind: recNote, at: time.Now(),
				text: fmt.Sprintf("capture: %d records dropped (writer behind, %d-byte budget); traffic was not", newDrops, s.cfg.Budget)})
		}
		for k := range batch {
			if err == nil {
				err = s.fr.write(&batch[k])
			}
			batch[k] = record{} // let the data go
		}
		full := errors.Is(err, errFull)
		if full {
			err = nil
		}
		if err == nil && (closed || full || len(batch) == 0) {
			err = s.bw.Flush()
		}
		s.mu.Lock()
		if s.spare == nil {
			s.spare = batch[:0]
		}
		if err != nil && s.err == nil {
			s.err = err
			s.closed = true // nothing more is queued
		}
		if full {
			s.closed = true
			clear(s.queue) // past the limit: never written
			s.queue = s.queue[:0]
			s.queued = 0
			s.doneOnce.Do(func() { close(s.done) })
		}
		stop := s.closed && len(s.queue) == 0
		s.mu.Unlock()
		if stop {
			if err == nil {
				s.bw.Flush()
			}
			return
		}
		if closed {
			s.kick()
		}
	}
}

func (s *Stream) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Close stops recording, writes what is queued and flushes. It returns the
// first write error.
func (s *Stream) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.kick()
	<-s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return fmt.Errorf("capture: write: %w", s.err)
	}
	if err := s.bw.Flush(); err != nil && !errors.Is(err, io.ErrShortWrite) {
		return fmt.Errorf("capture: flush: %w", err)
	}
	return nil
}
