package gro

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/ipoibcm/ipoib/offload"
)

// flowState is where one open chain is.
type flowState uint8

const (
	// flowIdle: the slot holds no chain.
	flowIdle flowState = iota
	// flowHeld: one segment, still in the caller's buffer; nothing copied.
	flowHeld
	// flowCoalescing: two or more segments, copied into a super-frame
	// buffer of the coalescer.
	flowCoalescing
)

func (s flowState) String() string {
	switch s {
	case flowIdle:
		return "idle"
	case flowHeld:
		return "held"
	case flowCoalescing:
		return "coalescing"
	}
	return fmt.Sprintf("flowState(%d)", uint8(s))
}

// flowEvent is what happens to a chain.
type flowEvent uint8

const (
	// evStart: a candidate segment opens the chain.
	evStart flowEvent = iota
	// evJoin: a segment that matches (flow.matches) joins it.
	evJoin
	// evEnd: the chain is complete: a segment of the flow did not join or
	// was the last one, the table needed the slot, or Flush.
	evEnd
)

func (e flowEvent) String() string {
	switch e {
	case evStart:
		return "start"
	case evJoin:
		return "join"
	case evEnd:
		return "end"
	}
	return fmt.Sprintf("flowEvent(%d)", uint8(e))
}

// flow is one open chain: a head segment and what has joined it.
type flow struct {
	state flowState
	key   flowKey
	// entry is the chain's frame in Coalescer.entries.
	entry int
	// h describes the head's headers; h.Len grows with the chain.
	h offload.Headers
	// mss is the head's payload, the most a joining segment may carry and
	// the super frame's GSOSize.
	mss int
	// next is the sequence number the next segment must carry.
	next uint32
	// count is the number of segments in the chain (NAPI_GRO_CB count).
	count int
	// fixedID: an atomic IPv4 flow whose segments all repeat the head's ID
	// (inet_gro_flush's ip_fixedid).
	fixedID bool
	// csum is the head's checksum state.
	csum csumState
}

// matches reports whether s may join the chain whose frame is head, by
// Linux's rules (see the package comment). The checksum and the buffer
// are checked by the caller, as Linux checks them last.
func (f *flow) matches(head []byte, s *segment) bool {
	seg := s.frame
	l3 := f.h.L3
	if !bytes.Equal(head[:l3], seg[:l3]) { // gro_list_prepare
		return false
	}
	hip, sip := head[l3:], seg[l3:]
	if f.h.IPv6 {
		// ipv6_gro_receive (version, flow label), ipv6_gro_flush (traffic
		// class, hop limit).
		if !bytes.Equal(hip[:4], sip[:4]) || hip[7] != sip[7] {
			return false
		}
	} else {
		// inet_gro_flush.
		if hip[1] != sip[1] || hip[8] != sip[8] || (hip[6]^sip[6])&(ipv4DF>>8) != 0 {
			return false
		}
		off := binary.BigEndian.Uint16(sip[4:]) - binary.BigEndian.Uint16(hip[4:])
		fixed := f.fixedID || (f.count == 1 && sip[6]&(ipv4DF>>8) != 0 && off == 0)
		if fixed && off != 0 || !fixed && off != uint16(f.count) {
			return false
		}
	}
	// tcp_gro_receive.
	ht, st := head[f.h.L4:f.h.End], seg[s.h.L4:s.h.End]
	if st[13]&tcpCWR != 0 {
		return false
	}
	if ht[12] != st[12] || (ht[13]^st[13])&^(tcpCWR|tcpFIN|tcpPSH) != 0 || ht[14] != st[14] || ht[15] != st[15] {
		return false // data offset, flags, window
	}
	if !bytes.Equal(ht[8:12], st[8:12]) || !bytes.Equal(ht[20:], st[20:]) {
		return false // acknowledgement, options (same length: same data offset)
	}
	return s.payload <= f.mss && s.seq == f.next
}

// transition moves f on ev; s is the segment that starts or joins it.
// The coalescer has checked that the event is allowed (matches, a free
// buffer, good checksums); any other combination is a bug.
func (c *Coalescer) transition(f *flow, ev flowEvent, s *segment) {
	switch {
	case f.state == flowIdle && ev == evStart:
		c.entries = append(c.entries, entry{frame: s.frame, meta: s.meta, first: -1, last: -1, open: true, tag: s.tag, buf: -1})
		*f = flow{
			state: flowHeld,
			key:   s.key,
			entry: len(c.entries) - 1,
			h:     s.h,
			mss:   s.payload,
			next:  s.seq + uint32(s.payload),
			count: 1,
			csum:  s.csum,
		}
	case f.state == flowHeld && ev == evJoin:
		e := &c.entries[f.entry]
		buf := c.takeBuffer()
		e.buf = int32(c.used - 1)
		if c.gather {
			e.hdr = buf[:copy(buf, e.frame[:f.h.End])]
			c.addPart(e, e.frame[f.h.End:f.h.Len], e.tag)
		} else {
			e.frame = buf[:copy(buf, e.frame)]
		}
		f.fixedID = !f.h.IPv6 && binary.BigEndian.Uint16(e.frame[f.h.L3+4:]) == binary.BigEndian.Uint16(s.frame[f.h.L3+4:])
		f.state = flowCoalescing
		c.join(f, s)
	case f.state == flowCoalescing && ev == evJoin:
		c.join(f, s)
	case f.state == flowHeld && ev == evEnd:
		c.entries[f.entry].open = false
		f.state = flowIdle
	case f.state == flowCoalescing && ev == evEnd:
		c.complete(f)
		c.entries[f.entry].open = false
		f.state = flowIdle
	default:
		panic(fmt.Sprintf("gro: flow event %v in state %v", ev, f.state))
	}
}

// join appends s's payload to the chain's super frame (when gathering,
// a reference to it).
func (c *Coalescer) join(f *flow, s *segment) {
	e := &c.entries[f.entry]
	if c.gather {
		c.addPart(e, s.frame[s.h.End:s.h.Len], s.tag)
	} else {
		n := len(e.frame)
		e.frame = e.frame[:n+s.payload]
		copy(e.frame[n:], s.frame[s.h.End:s.h.Len])
	}
	e.headers()[f.h.L4+13] |= s.flags & (tcpFIN | tcpPSH)
	f.h.Len += s.payload
	f.next += uint32(s.payload)
	f.count++
}

// complete fixes up a super frame's headers and Meta, as
// tcp4_gro_complete / tcp6_gro_complete and tcp_gro_complete do.
func (c *Coalescer) complete(f *flow) {
	e := &c.entries[f.entry]
	hdr := e.headers()
	ip := hdr[f.h.L3:]
	gso := offload.GSOTCPv4
	if f.h.IPv6 {
		gso = offload.GSOTCPv6
		binary.BigEndian.PutUint16(ip[4:], uint16(f.h.Len-f.h.L3-40))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(f.h.Len-f.h.L3))
	}
	f.h.FillPartial(hdr)
	e.meta = offload.Meta{
		GSO:        gso,
		ECN:        hdr[f.h.L4+13]&tcpCWR != 0,
		GSOSize:    uint16(f.mss),
		NeedsCsum:  true,
		CsumStart:  uint16(f.h.L4),
		CsumOffset: 16,
	}
	c.stats.frames.Add(1)
	c.stats.segments.Add(uint64(f.count))
}
