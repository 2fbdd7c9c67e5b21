package gro

import (
	"fmt"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/offload"
)

// Defaults for the zero fields of Config.
const (
	// DefaultFlows is Linux's MAX_GRO_SKBS: chains open at once in one
	// GRO bucket.
	DefaultFlows = 8
	// DefaultBuffers is the super frames one batch may build: a 64-frame
	// poll batch of 4 KiB UD frames fills four.
	DefaultBuffers = 8
	// DefaultBatch is the frames the table holds between flushes without
	// growing: a NAPI budget.
	DefaultBatch = 64
)

// Config sizes a Coalescer.
type Config struct {
	// L3Off is the length of the link header in front of the IP header of
	// every frame (14 for Ethernet); it is copied from the head segment
	// and must be equal for segments to merge.
	L3Off int
	// Flows is how many chains may be open at once (DefaultFlows if 0).
	Flows int
	// Buffers is how many super frames one batch may build, each
	// L3Off+65535 bytes, allocated on first use (DefaultBuffers if 0).
	Buffers int
	// Batch is how many frames Add takes between flushes before its
	// table grows (DefaultBatch if 0).
	Batch int
	// Gather builds super frames for a writer that gathers (writev):
	// instead of copying every segment into a 64 KiB buffer, a chain
	// keeps a copy of the head's headers (its buffers are headers-sized)
	// and references to each segment's payload where Add found it;
	// FlushVec hands out those pieces. Flush still emits whole frames,
	// copying the pieces together at the end.
	Gather bool
}

// Coalescer merges the TCP segments of a batch of frames. See the package
// comment for the rules. It is not safe for concurrent use, except Stats.
type Coalescer struct {
	l3off   int
	nbufs   int
	gather  bool
	entries []entry
	flows   []flow
	bufs    [][]byte // super frames, or their headers when gathering
	used    int      // bufs handed out in this batch
	seg     segment
	stats   stats

	// Gathering: parts are the payloads of the batch's chains, each
	// linked to the next of its chain; flat are the 64 KiB buffers Flush
	// copies gathered frames into; iov is what FlushVec hands out.
	parts []part
	flat  [][]byte
	iov   [][]byte
	// keep is keepOpen's scratch: the open chains' parts, renumbered.
	keep []part
}

// entry is one output frame, in input order of its first segment. When
// gathering, a super frame is hdr (the head's headers, fixed up) followed
// by its chain of parts from first to last; frame is the head segment.
type entry struct {
	frame       []byte
	meta        offload.Meta
	hdr         []byte
	first, last int32
	// open: the entry is an open chain's (a flow's f.entry), which
	// FlushOpen keeps. tag is the head frame's (AddHeaders); buf the
	// index in bufs of the chain's super-frame or headers buffer, -1
	// before it has one.
	open bool
	tag  int32
	buf  int32
}

// part is one segment's payload in a gathered chain; next is the index of
// the chain's next part, -1 at the end.
type part struct {
	b    []byte
	next int32
	tag  int32 // of the frame b lies in
}

// gatherHdrLen is the most header a gathered chain copies behind the link
// header: IPv6's 40 bytes (IPv4 merges without options) and a TCP header
// with the longest options.
const gatherHdrLen = 40 + 60

// New makes a Coalescer.
func New(cfg Config) (*Coalescer, error) {
	if cfg.L3Off < 0 || cfg.Flows < 0 || cfg.Buffers < 0 || cfg.Batch < 0 {
		return nil, fmt.Errorf("gro: negative size in %+v", cfg)
	}
	cfg.Flows = cmpOr(cfg.Flows, DefaultFlows)
	cfg.Buffers = cmpOr(cfg.Buffers, DefaultBuffers)
	cfg.Batch = cmpOr(cfg.Batch, DefaultBatch)
	c := &Coalescer{
		l3off:   cfg.L3Off,
		nbufs:   cfg.Buffers,
		gather:  cfg.Gather,
		entries: make([]entry, 0, cfg.Batch),
		flows:   make([]flow, cfg.Flows),
		bufs:    make([][]byte, 0, cfg.Buffers),
	}
	if c.gather {
		c.parts = make([]part, 0, cfg.Batch)
		c.iov = make([][]byte, 0, cfg.Batch)
	}
	return c, nil
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Add takes one frame and its offload state. The coalescer keeps frame
// (and may copy it) until Flush has emitted it.
func (c *Coalescer) Add(frame []byte, meta offload.Meta) {
	c.seg.classify(frame, meta, c.l3off)
	c.seg.tag = -1
	c.add()
}

// AddHeaders is Add of a frame the caller has parsed already: h and l4
// must be what offload.ReadHeaders(frame, L3Off) returns for it (its first
// and third results). A receive path that read the headers for its own
// checks hands the reading over, so each packet is parsed once. tag is
// the caller's name for the frame, which FlushOpen reports while an open
// chain holds it (Add's frames are -1).
func (c *Coalescer) AddHeaders(frame []byte, meta offload.Meta, h offload.Headers, l4 bool, tag int32) {
	c.seg.classifyRead(frame, meta, h, l4)
	c.seg.tag = tag
	c.add()
}

// add takes the segment Add or AddHeaders classified.
func (c *Coalescer) add() {
	s := &c.seg
	frame, meta := s.frame, s.meta
	if s.class == segOther {
		c.endUnkeyed(frame)
		c.entries = append(c.entries, entry{frame: frame, meta: meta})
		return
	}
	f := c.lookup(&s.key)
	if f != nil && c.offer(f, s) {
		return
	}
	if s.class != segCandidate || s.final || s.csum == csumBad {
		c.entries = append(c.entries, entry{frame: frame, meta: meta})
		return
	}
	if f == nil {
		f = c.slot()
	}
	c.transition(f, evStart, s)
}

// IP protocols that are never a TCP flow's: what endUnkeyed lets by.
const (
	protoICMPv6 = 58
	protoNoNext = 59 // IPv6: nothing behind the header
)

// endUnkeyed ends the open chains that frame, which GRO cannot key
// (segOther), may be a frame of: an IP packet between their addresses in
// their direction that may carry TCP, as an IPv4 fragment, an IPv6 packet
// behind extension headers or a TCP header ReadHeaders refuses do. Such a
// frame must leave after the chain, as a frame of the flow that cannot
// join does (segAlone); an entry after an open chain comes after it in a
// Flush anyway, but FlushOpen emits it and keeps the chain. UDP, ICMP and
// what is not IP leave the chains open.
func (c *Coalescer) endUnkeyed(frame []byte) {
	if len(frame) <= c.l3off {
		return
	}
	ip := frame[c.l3off:]
	var key flowKey
	switch {
	case len(ip) >= 20 && ip[0]>>4 == 4:
		if ip[9] != offload.ProtoTCP {
			return
		}
		copy(key.addrs[0:4], ip[12:16])
		copy(key.addrs[16:20], ip[16:20])
	case len(ip) >= 40 && ip[0]>>4 == 6:
		if nh := ip[6]; nh == offload.ProtoUDP || nh == protoICMPv6 || nh == protoNoNext {
			return
		}
		copy(key.addrs[:], ip[8:40])
		key.v6 = true
	default:
		return
	}
	for i := range c.flows {
		if f := &c.flows[i]; f.state != flowIdle && f.key.v6 == key.v6 && f.key.addrs == key.addrs {
			c.transition(f, evEnd, nil)
		}
	}
}

// offer joins s to its flow's chain f, or ends the chain and reports
// false.
func (c *Coalescer) offer(f *flow, s *segment) bool {
	head := c.entries[f.entry].headers()
	ok := s.class == segCandidate && f.matches(head, s) && f.h.Len-f.h.L3+s.payload <= maxIPLen
	if ok && f.state == flowHeld && c.used == c.nbufs {
		c.stats.noBuffer.Add(1)
		ok = false
	}
	if ok && f.csum == csumUnknown {
		f.csum = verdict(offload.VerifyChecksums(head, c.l3off), &c.stats)
	}
	ok = ok && f.csum == csumGood && s.verify(c.l3off, &c.stats) == csumGood
	if !ok {
		c.transition(f, evEnd, nil)
		return false
	}
	c.transition(f, evJoin, s)
	if s.payload < f.mss || s.final {
		c.transition(f, evEnd, nil)
	}
	return true
}

// lookup finds the open chain of key.
func (c *Coalescer) lookup(key *flowKey) *flow {
	for i := range c.flows {
		if f := &c.flows[i]; f.state != flowIdle && f.key == *key {
			return f
		}
	}
	return nil
}

// slot finds an idle flow slot, ending the oldest chain if there is none
// (gro_flush_oldest).
func (c *Coalescer) slot() *flow {
	var oldest *flow
	for i := range c.flows {
		f := &c.flows[i]
		if f.state == flowIdle {
			return f
		}
		if oldest == nil || f.entry < oldest.entry {
			oldest = f
		}
	}
	c.stats.evicted.Add(1)
	c.transition(oldest, evEnd, nil)
	return oldest
}

// takeBuffer hands out the next super-frame buffer of this batch; the
// caller has checked that one is left. Its index in bufs is c.used-1.
func (c *Coalescer) takeBuffer() []byte {
	if c.used == len(c.bufs) {
		size := c.l3off + maxIPLen
		if c.gather {
			size = c.l3off + gatherHdrLen
		}
		c.bufs = append(c.bufs, make([]byte, size))
	}
	c.used++
	return c.bufs[c.used-1]
}

// headers is where the entry's (head's) headers are: the copy a gathered
// chain fixes up, else the frame.
func (e *entry) headers() []byte {
	if e.hdr != nil {
		return e.hdr
	}
	return e.frame
}

// addPart appends b, which lies in the frame tagged tag, to the chain of
// e (gathering).
func (c *Coalescer) addPart(e *entry, b []byte, tag int32) {
	k := int32(len(c.parts))
	c.parts = append(c.parts, part{b: b, next: -1, tag: tag})
	if e.first < 0 {
		e.first = k
	} else {
		c.parts[e.last].next = k
	}
	e.last = k
}

// Pending is the number of frames Flush would emit now.
func (c *Coalescer) Pending() int { return len(c.entries) }

// Flush completes every open chain and emits the batch in order: the
// frames Add took that did not merge, as they were, and the super frames.
// A super frame's bytes stay valid until the next Add. The coalescer then
// holds nothing of the caller's.
func (c *Coalescer) Flush(emit func(frame []byte, meta offload.Meta)) {
	c.endChains()
	c.emit(emit)
	c.reset()
}

// FlushOpen is Flush for a batch that goes on, as Linux's napi_poll keeps
// its GRO lists across polls that used their whole budget and flushes
// them when the poll completes (napi_complete_done): every frame is
// emitted but those of the chains still open, which stay for the next
// Add or flush, so a flow's next segments can join them. held is called
// with the tag (AddHeaders) of every frame of the caller's those chains
// still hold; the caller keeps each one as it is until a later flush no
// longer reports it. A flow's frames still leave in the order they came:
// an open chain is its flow's latest frames. The super frames emitted
// stay valid until the next Add.
func (c *Coalescer) FlushOpen(emit func(frame []byte, meta offload.Meta), held func(tag int32)) {
	c.emit(emit)
	c.keepOpen(held)
}

// emit hands emit every entry but the open chains', in order (Flush).
func (c *Coalescer) emit(emit func(frame []byte, meta offload.Meta)) {
	flat := 0
	for i := range c.entries {
		e := &c.entries[i]
		if e.open {
			continue
		}
		if e.hdr == nil {
			emit(e.frame, e.meta)
			continue
		}
		if flat == len(c.flat) {
			c.flat = append(c.flat, make([]byte, c.l3off+maxIPLen))
		}
		b := c.flat[flat]
		flat++
		n := copy(b, e.hdr)
		for k := e.first; k >= 0; k = c.parts[k].next {
			n += copy(b[n:], c.parts[k].b)
		}
		emit(b[:n], e.meta)
	}
}

// FlushVec is Flush for a writer that gathers: each frame comes out as
// the pieces it is made of, in order. An unmerged frame is one piece, as
// Add took it. A super frame of a Config.Gather coalescer is its fixed-up
// headers (the coalescer's) followed by each segment's payload where it
// lies in the frame Add took, nothing copied; without Gather it is one
// piece, the coalescer's super frame. The pieces, and the slice holding
// them, stay valid until the next Add.
func (c *Coalescer) FlushVec(emit func(pieces [][]byte, meta offload.Meta)) {
	c.endChains()
	c.emitVec(emit)
	c.reset()
}

// FlushVecOpen is FlushOpen for a writer that gathers: what it emits,
// FlushVec's pieces; what it keeps and reports, FlushOpen's.
func (c *Coalescer) FlushVecOpen(emit func(pieces [][]byte, meta offload.Meta), held func(tag int32)) {
	c.emitVec(emit)
	c.keepOpen(held)
}

// emitVec hands emit every entry but the open chains' as its pieces, in
// order (FlushVec).
func (c *Coalescer) emitVec(emit func(pieces [][]byte, meta offload.Meta)) {
	need := len(c.entries) + len(c.parts)
	if cap(c.iov) < need {
		c.iov = make([][]byte, 0, need)
	}
	iov := c.iov[:0]
	for i := range c.entries {
		e := &c.entries[i]
		if e.open {
			continue
		}
		start := len(iov)
		if e.hdr == nil {
			iov = append(iov, e.frame)
		} else {
			iov = append(iov, e.hdr)
			for k := e.first; k >= 0; k = c.parts[k].next {
				iov = append(iov, c.parts[k].b)
			}
		}
		emit(iov[start:len(iov):len(iov)], e.meta)
	}
	c.iov = iov[:0]
}

// keepOpen forgets the batch but its open chains, whose entries, parts
// and buffers move to the front, in order, so that the next batch builds
// on them with the rest free; held hears the tags of the caller's frames
// they hold: a held chain's one frame, or every frame a gathered chain
// has a payload in (a copying chain holds nothing of the caller's once it
// has a buffer).
func (c *Coalescer) keepOpen(held func(tag int32)) {
	keep := c.keep[:0]
	n, nb := 0, int32(0)
	for i := range c.entries {
		e := c.entries[i]
		if !e.open {
			continue
		}
		for k := range c.flows {
			if f := &c.flows[k]; f.state != flowIdle && f.entry == i {
				f.entry = n
			}
		}
		if e.buf >= 0 {
			// Swap the chain's buffer to the front of those in use; a
			// later open chain that had the front one takes its place.
			if e.buf != nb {
				c.bufs[e.buf], c.bufs[nb] = c.bufs[nb], c.bufs[e.buf]
				for j := i + 1; j < len(c.entries); j++ {
					if c.entries[j].open && c.entries[j].buf == nb {
						c.entries[j].buf = e.buf
					}
				}
				e.buf = nb
			}
			nb++
		}
		switch {
		case e.first >= 0:
			first := int32(len(keep))
			for k := e.first; k >= 0; k = c.parts[k].next {
				held(c.parts[k].tag)
				keep = append(keep, part{b: c.parts[k].b, next: int32(len(keep)) + 1, tag: c.parts[k].tag})
			}
			keep[len(keep)-1].next = -1
			e.first, e.last = first, int32(len(keep)-1)
		case e.hdr == nil && e.buf < 0:
			held(e.tag) // one segment, in the caller's frame
		}
		c.entries[n] = e
		n++
	}
	clear(c.entries[n:])
	c.entries = c.entries[:n]
	clear(c.parts)
	c.parts = append(c.parts[:0], keep...)
	clear(keep)
	c.keep = keep[:0]
	c.seg = segment{}
	c.used = int(nb)
}

// endChains completes every open chain.
func (c *Coalescer) endChains() {
	for i := range c.flows {
		if c.flows[i].state != flowIdle {
			c.transition(&c.flows[i], evEnd, nil)
		}
	}
}

// reset forgets the batch: the coalescer then holds nothing of the
// caller's.
func (c *Coalescer) reset() {
	clear(c.entries)
	c.entries = c.entries[:0]
	clear(c.parts)
	c.parts = c.parts[:0]
	c.seg = segment{}
	c.used = 0
}

// Stats are a Coalescer's cumulative counts.
type Stats struct {
	// Frames is the super frames built; Segments the segments merged into
	// them (at least two each).
	Frames, Segments uint64
	// Verified is the checksums verified in software (segments without a
	// known-good checksum, each just before it would have merged);
	// BadCsum those that failed: they passed on unmerged.
	Verified, BadCsum uint64
	// NoBuffer is merges not done because the batch had used every
	// super-frame buffer; Evicted chains ended early because Flows chains
	// were open.
	NoBuffer, Evicted uint64
}

type stats struct {
	frames, segments, verified, badCsum, noBuffer, evicted atomic.Uint64
}

// Stats reads the counts; it may be called from any goroutine.
func (c *Coalescer) Stats() Stats {
	s := &c.stats
	return Stats{
		Frames: s.frames.Load(), Segments: s.segments.Load(),
		Verified: s.verified.Load(), BadCsum: s.badCsum.Load(),
		NoBuffer: s.noBuffer.Load(), Evicted: s.evicted.Load(),
	}
}
