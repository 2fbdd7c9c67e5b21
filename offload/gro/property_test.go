package gro

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
)

// sender is one TCP flow of the property test: a byte stream cut into
// segments whose headers wander the way real flows' do.
type sender struct {
	tmpl    pkt
	stream  []byte
	off     int // bytes of stream sent (or skipped)
	mss     int
	fixedID bool
	ts      bool
	tsval   uint32
	id      uint16
	last    *input
	// calm: rarely perturbed, so chains grow to the 64 KiB limit.
	calm bool
}

// input is one frame of the generated batch and what the test knows of it.
type input struct {
	frame []byte
	meta  offload.Meta
	flow  int  // index of its sender, -1 if not TCP of a sender
	good  bool // its checksum is right (or trusted)
}

// gen builds a random mix: several IPv4/IPv6 flows with random MSS,
// interleaved, with flag, option, window, ack, TOS/TTL, flow-label and
// ID changes, short and oversized segments, pure ACKs, duplicates,
// reordering, holes, wrong checksums, and UDP, non-IP and garbage frames
// mixed in.
func gen(r *rand.Rand) ([]input, []*sender) {
	var ss []*sender
	calm := r.IntN(4) == 0
	nflows := 1 + r.IntN(5)
	if calm {
		nflows = 1 + r.IntN(2)
	}
	for k := range nflows {
		p := basePkt(r.IntN(2) == 0)
		p.sport = uint16(10000 + k)
		p.seq = r.Uint32()
		p.id = uint16(r.Uint32())
		p.label = r.Uint32() & 0xFFFFF
		s := &sender{tmpl: p, mss: []int{1448, 4028, 536, 1 + r.IntN(3000)}[r.IntN(4)], fixedID: r.IntN(4) == 0, ts: r.IntN(2) == 0, tsval: r.Uint32()}
		s.id, s.calm = p.id, calm
		s.stream = make([]byte, 200000)
		for i := range s.stream {
			s.stream[i] = byte(r.Uint32())
		}
		ss = append(ss, s)
	}
	var in []input
	n := 50 + r.IntN(300)
	for len(in) < n {
		switch x := r.IntN(100); {
		case x < 4:
			u := basePkt(r.IntN(2) == 0)
			u.udp, u.payload = true, payload(r.IntN(1400), byte(x))
			f, m := u.frame()
			in = append(in, input{frame: f, meta: m, flow: -1, good: true})
		case x < 6:
			g := make([]byte, r.IntN(80))
			for i := range g {
				g[i] = byte(r.Uint32())
			}
			in = append(in, input{frame: g, flow: -1})
		case x < 9 && len(in) > 1: // reorder
			i := r.IntN(len(in) - 1)
			in[i], in[i+1] = in[i+1], in[i]
		default:
			k := r.IntN(len(ss))
			if in2, ok := ss[k].next(r, k); ok {
				in = append(in, in2)
			}
		}
	}
	return in, ss
}

// next makes the sender's next frame.
func (s *sender) next(r *rand.Rand, k int) (input, bool) {
	if s.calm && r.IntN(10) != 0 {
		return s.plain(k)
	}
	if s.last != nil && r.IntN(25) == 0 { // duplicate (a retransmission)
		return *s.last, true
	}
	p := s.tmpl
	size := s.mss
	switch x := r.IntN(40); {
	case x == 0:
		size = 0 // pure ACK
	case x < 4:
		size = 1 + r.IntN(s.mss)
	case x == 4:
		size = s.mss + 1 + r.IntN(100)
	}
	if r.IntN(30) == 0 { // hole: lost on the way
		s.off += size
	}
	if s.off+size > len(s.stream) {
		return input{}, false
	}
	switch x := r.IntN(60); {
	case x == 0:
		s.tmpl.ack += uint32(r.IntN(5000))
	case x == 1:
		s.tmpl.win = uint16(r.Uint32())
	case x == 2:
		s.tmpl.tos ^= 4
	case x == 3:
		s.tmpl.ttl--
	case x == 4:
		s.tmpl.label = r.Uint32() & 0xFFFFF
	case x == 5:
		s.tmpl.link[0] ^= 2
	case x == 6:
		s.id += uint16(r.IntN(3))
	case x == 7:
		s.tmpl.flags ^= 0x40 // ECE
	}
	p = s.tmpl
	if r.IntN(8) == 0 {
		s.tsval++
	}
	if s.ts {
		p.opts = tsOpt(s.tsval, 99)
	}
	switch x := r.IntN(80); {
	case x < 4:
		p.flags |= tcpPSH
	case x == 4:
		p.flags |= tcpCWR
	case x == 5:
		p.flags |= tcpFIN
	case x == 6:
		p.flags |= tcpURG
	case x == 7:
		p.flags |= tcpRST
	case x == 8:
		p.flags |= tcpSYN
	case x == 9:
		p.ipOpts = 4
	case x == 10:
		p.padding = 4
	case x == 11:
		p.gso = true
	}
	p.seq = s.tmpl.seq + uint32(s.off)
	p.id = s.id
	if !s.fixedID {
		s.id++
	} else {
		p.df = true
	}
	p.payload = s.stream[s.off : s.off+size]
	s.off += size
	p.csum = csumKind(r.IntN(4))
	if p.csum == csumWrong && r.IntN(3) != 0 {
		p.csum = csumNone
	}
	if p.gso {
		p.csum = csumValid // see the NeedsCsum test in TestCoalesceProperty
	}
	f, m := p.frame()
	in := input{frame: f, meta: m, flow: k, good: p.csum != csumWrong}
	s.last = &in
	return in, true
}

// plain is the next full-sized segment with nothing changed.
func (s *sender) plain(k int) (input, bool) {
	if s.off+s.mss > len(s.stream) {
		return input{}, false
	}
	p := s.tmpl
	if s.ts {
		p.opts = tsOpt(s.tsval, 99)
	}
	size := s.mss
	p.seq, p.id, p.df = s.tmpl.seq+uint32(s.off), s.id, s.tmpl.df || s.fixedID
	if !s.fixedID {
		s.id++
	}
	p.payload = s.stream[s.off : s.off+size]
	s.off += size
	p.csum = csumValid
	f, m := p.frame()
	in := input{frame: f, meta: m, flow: k, good: true}
	s.last = &in
	return in, true
}

// unit is one segment of the output: an untouched frame, or one segment
// TSO cuts from a super frame.
type unit struct {
	frame  []byte
	meta   offload.Meta
	merged bool
	group  int // the super frame it came from
}

// TestCoalesceProperty: whatever is coalesced, each flow's segments,
// cut back out of the super frames by offload.Segment, are the segments
// that came in, in the same order, bit for bit except checksums and
// fixed IPv4 IDs; the bytes a receiving TCP reads are the same; every
// frame that did not merge is untouched and in place; every super frame
// has valid checksums once completed, is at most 64 KiB of IP and holds
// only segments with good checksums. A gathering coalescer (Config.Gather)
// emits the same frames, byte for byte, with FlushVec (its payload pieces
// in the input frames, not copied) and with Flush, and no coalescer
// writes to its input. All of it holds too when the batches go on
// (FlushOpen, FlushVecOpen) and a frame is scribbled over once no flush
// reports it held any more.
func TestCoalesceProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	segBufs := make([][]byte, 100)
	for i := range segBufs {
		segBufs[i] = make([]byte, 70000)
	}
	var merges, longest, gathered int
	// A long chain needs a flow that stays clean for 40 segments, which
	// 60 short-mode iterations reach less often than 400 do.
	iters, minLongest := 400, 40
	if testing.Short() {
		iters, minLongest = 60, 24
	}
	for iter := range iters {
		in, ss := gen(r)
		cfg := Config{Flows: 1 + r.IntN(8), Buffers: 1 + r.IntN(8), Batch: 1 + r.IntN(64)}
		c := newC(t, cfg)
		// The gathering coalescers must emit exactly what the copying one
		// does, so every property below holds for them too.
		twins := []*gatherTwin{newGatherTwin(t, cfg, true), newGatherTwin(t, cfg, false)}
		orig := make([][]byte, len(in))
		for i, x := range in {
			orig[i] = bytes.Clone(x.frame)
		}
		// Half the time the batches go on (FlushOpen) until the last:
		// every coalescer then works on its own copies, which are
		// scribbled over as soon as a flush no longer reports them held.
		open := r.IntN(2) == 0
		var feeds []*openFeed
		if open {
			feeds = []*openFeed{newOpenFeed(c, len(in))}
			for _, g := range twins {
				feeds = append(feeds, newOpenFeed(g.c, len(in)))
			}
		}
		var out []outFrame
		emit := func(f []byte, m offload.Meta) { out = append(out, outFrame{bytes.Clone(f), m}) }
		for lo := 0; lo < len(in); {
			hi := min(len(in), lo+1+r.IntN(100))
			batch := make([][]byte, 0, hi-lo)
			for _, x := range in[lo:hi] {
				if open {
					for _, o := range feeds {
						o.add(x.frame, x.meta)
					}
					continue
				}
				c.Add(x.frame, x.meta)
				for _, g := range twins {
					g.c.Add(x.frame, x.meta)
				}
				batch = append(batch, x.frame)
			}
			switch {
			case !open:
				c.Flush(emit)
				for _, g := range twins {
					g.flush(t, batch)
				}
			case hi == len(in):
				c.Flush(emit)
				for k, g := range twins {
					g.flush(t, feeds[k+1].copies)
				}
			default:
				c.FlushOpen(emit, feeds[0].mark)
				for k, g := range twins {
					g.flushOpen(t, feeds[k+1].copies, feeds[k+1].mark)
				}
				for _, o := range feeds {
					o.release()
				}
			}
			lo = hi
		}
		for _, g := range twins {
			g.check(t, out)
		}
		gathered += twins[0].zeroCopy
		for i, x := range in {
			if !bytes.Equal(x.frame, orig[i]) {
				t.Fatalf("iter %d: input frame %d modified", iter, i)
			}
		}
		inBytes, outBytes := 0, 0
		for _, x := range in {
			inBytes += len(x.frame)
		}
		var units []unit
		for _, o := range out {
			outBytes += len(o.frame)
			if o.meta.GSO == offload.GSONone || !o.meta.NeedsCsum {
				// Untouched (the generator's GSO inputs carry no NeedsCsum;
				// a super frame without it fails the per-flow comparison).
				units = append(units, unit{frame: o.frame, meta: o.meta})
				continue
			}
			h, err := offload.Parse(o.frame, l3)
			if err != nil || h.Len != len(o.frame) || h.Len-l3 > 65535 || o.meta.GSOSize == 0 {
				t.Fatalf("iter %d: super frame len %d: %v", iter, len(o.frame), err)
			}
			if !o.meta.NeedsCsum || int(o.meta.CsumStart) != h.L4 || o.meta.CsumOffset != 16 {
				t.Fatalf("iter %d: meta %+v", iter, o.meta)
			}
			if !naiveValid(complete(o.frame, o.meta)) {
				t.Fatalf("iter %d: super frame checksum invalid after completion", iter)
			}
			for i := range segBufs {
				segBufs[i] = segBufs[i][:cap(segBufs[i])]
			}
			// A chain kept across batches (FlushOpen) can hold more
			// segments than a batch has frames.
			for need := h.Segments(int(o.meta.GSOSize)); len(segBufs) < need; {
				segBufs = append(segBufs, make([]byte, h.End+int(o.meta.GSOSize)))
			}
			n, err := offload.Segment(o.frame, l3, int(o.meta.GSOSize), segBufs)
			if err != nil || n < 2 {
				t.Fatalf("iter %d: resegment: %d, %v", iter, n, err)
			}
			merges++
			longest = max(longest, n)
			for _, sg := range segBufs[:n] {
				units = append(units, unit{frame: bytes.Clone(sg), merged: true, group: merges})
			}
		}
		if len(out) > len(in) || outBytes > inBytes {
			t.Fatalf("iter %d: %d frames %d bytes out of %d frames %d bytes", iter, len(out), outBytes, len(in), inBytes)
		}
		if len(units) != len(in) {
			t.Fatalf("iter %d: %d segments out, %d in", iter, len(units), len(in))
		}
		// Per flow (and the non-flow frames as one more), in order.
		perIn := map[flowKey][]int{}
		perOut := map[flowKey][]int{}
		for i, x := range in {
			perIn[testKey(x.frame)] = append(perIn[testKey(x.frame)], i)
		}
		for i, u := range units {
			perOut[testKey(u.frame)] = append(perOut[testKey(u.frame)], i)
		}
		ids := map[int][]int{} // super frame → its input segments
		for key, ins := range perIn {
			outs := perOut[key]
			if len(outs) != len(ins) {
				t.Fatalf("iter %d: flow has %d segments in, %d out", iter, len(ins), len(outs))
			}
			for j := range ins {
				x, u := in[ins[j]], units[outs[j]]
				if !u.merged {
					if !bytes.Equal(u.frame, x.frame) || u.meta != x.meta {
						t.Fatalf("iter %d: segment %d of a flow changed or moved", iter, j)
					}
					continue
				}
				if !x.good || x.meta.GSO != offload.GSONone {
					t.Fatalf("iter %d: a segment with a bad checksum or GSO meta was merged", iter)
				}
				if !bytes.Equal(canon(u.frame), canon(x.frame)) {
					t.Fatalf("iter %d: merged segment %d differs after TSO", iter, j)
				}
				ids[u.group] = append(ids[u.group], ins[j])
			}
		}
		for _, group := range ids {
			checkIDs(t, in, group)
		}
		for k, s := range ss {
			got, want := readStream(in, units, k, s)
			if !bytes.Equal(got, want) {
				t.Fatalf("iter %d flow %d: the receiver reads %d bytes through GRO, %d without", iter, k, len(got), len(want))
			}
		}
	}
	if merges < iters || longest < minLongest {
		t.Fatalf("property test barely merged: %d super frames, longest %d segments", merges, longest)
	}
	if gathered < 2*merges {
		t.Fatalf("FlushVec handed out %d payload pieces in place for %d super frames", gathered, merges)
	}
	t.Logf("%d super frames, longest %d segments, %d payload pieces gathered in place", merges, longest, gathered)
}

// checkIDs: the IPv4 segments merged into one frame had IDs counting up
// from the head's, or all the head's with DF (inet_gro_flush).
func checkIDs(t *testing.T, in []input, group []int) {
	t.Helper()
	head := in[group[0]].frame[l3:]
	if head[0]>>4 != 4 {
		return
	}
	id0 := binary.BigEndian.Uint16(head[4:])
	fixed, counting := head[6]&0x40 != 0, true
	for i, k := range group {
		id := binary.BigEndian.Uint16(in[k].frame[l3+4:])
		fixed = fixed && id == id0
		counting = counting && id == id0+uint16(i)
	}
	if !fixed && !counting {
		t.Fatalf("merged IPv4 segments with IDs neither fixed nor counting up")
	}
}

// testKey is a frame's flow as the test sees it, the zero key for frames
// that are not TCP.
func testKey(f []byte) flowKey {
	var s segment
	s.classify(f, offload.Meta{}, l3)
	if s.class == segOther {
		return flowKey{}
	}
	return s.key
}

// readStream is what a TCP receiver of sender k reads in order from the
// input and from the output: segments with bad checksums are dropped,
// duplicates ignored, out-of-order data queued until the hole fills.
func readStream(in []input, units []unit, k int, s *sender) (viaGRO, direct []byte) {
	var dsegs, gsegs [][]byte
	key := flowKey{}
	for _, x := range in {
		if x.flow == k {
			key = testKey(x.frame)
			if x.good {
				dsegs = append(dsegs, x.frame)
			}
		}
	}
	for _, u := range units {
		if testKey(u.frame) != key {
			continue
		}
		ok := u.merged && naiveValid(u.frame)
		if !u.merged {
			ok = u.meta.DataValid || u.meta.NeedsCsum || naiveValid(u.frame)
		}
		if ok {
			gsegs = append(gsegs, u.frame)
		}
	}
	isn := s.tmpl.seq
	return reassemble(gsegs, isn), reassemble(dsegs, isn)
}

func reassemble(segs [][]byte, isn uint32) []byte {
	var got []byte
	pending := map[uint32][]byte{}
	for _, f := range segs {
		h, err := offload.Parse(f, l3)
		if err != nil {
			continue
		}
		seq := binary.BigEndian.Uint32(f[h.L4+4:]) - isn
		pending[seq] = f[h.End:h.Len]
		for {
			p, ok := pending[uint32(len(got))]
			if !ok || len(p) == 0 {
				break
			}
			delete(pending, uint32(len(got)))
			got = append(got, p...)
		}
	}
	return got
}
