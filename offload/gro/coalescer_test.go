package gro

import (
	"bytes"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
)

// chain makes n in-order segments of size bytes each from base.
func chain(base pkt, n, size int) []pkt {
	ps := make([]pkt, n)
	for i := range ps {
		p := base
		p.seq = base.seq + uint32(i*size)
		p.id = base.id + uint16(i)
		p.payload = payload(size, byte(i))
		ps[i] = p
	}
	return ps
}

func frames(ps []pkt) ([][]byte, []offload.Meta) {
	fs := make([][]byte, len(ps))
	ms := make([]offload.Meta, len(ps))
	for i, p := range ps {
		fs[i], ms[i] = p.frame()
	}
	return fs, ms
}

// TestMergeRules: the second segment of a two-segment chain differs from
// the first in one respect; it merges exactly when Linux's GRO would.
func TestMergeRules(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, c := range []struct {
			name  string
			v4    bool // IPv4 only
			v6    bool // IPv6 only
			merge bool
			edit  func(a, b *pkt)
		}{
			{name: "same", merge: true, edit: func(a, b *pkt) {}},
			{name: "psh on last", merge: true, edit: func(a, b *pkt) { b.flags |= tcpPSH }},
			{name: "fin on last", merge: true, edit: func(a, b *pkt) { b.flags |= tcpFIN }},
			{name: "psh on first", edit: func(a, b *pkt) { a.flags |= tcpPSH }},
			{name: "cwr on first", merge: true, edit: func(a, b *pkt) { a.flags |= tcpCWR }},
			{name: "cwr on second", edit: func(a, b *pkt) { b.flags |= tcpCWR }},
			{name: "ece on both", merge: true, edit: func(a, b *pkt) { a.flags |= 0x40; b.flags |= 0x40 }},
			{name: "ece differs", edit: func(a, b *pkt) { b.flags |= 0x40 }},
			{name: "syn", edit: func(a, b *pkt) { a.flags |= tcpSYN; b.flags |= tcpSYN }},
			{name: "rst", edit: func(a, b *pkt) { b.flags |= tcpRST }},
			{name: "urg", edit: func(a, b *pkt) { b.flags |= tcpURG }},
			{name: "window", edit: func(a, b *pkt) { b.win++ }},
			{name: "ack", edit: func(a, b *pkt) { b.ack++ }},
			{name: "ts equal", merge: true, edit: func(a, b *pkt) { a.opts, b.opts = tsOpt(5, 6), tsOpt(5, 6) }},
			{name: "ts differs", edit: func(a, b *pkt) { a.opts, b.opts = tsOpt(5, 6), tsOpt(6, 6) }},
			{name: "options length", edit: func(a, b *pkt) { a.opts = tsOpt(5, 6) }},
			{name: "seq gap", edit: func(a, b *pkt) { b.seq++ }},
			{name: "seq overlap", edit: func(a, b *pkt) { b.seq-- }},
			{name: "second larger", edit: func(a, b *pkt) { b.payload = payload(len(a.payload)+1, 3) }},
			{name: "second smaller", merge: true, edit: func(a, b *pkt) { b.payload = b.payload[:7] }},
			{name: "no payload", edit: func(a, b *pkt) { b.payload = nil }},
			{name: "link header", edit: func(a, b *pkt) { b.link[0] ^= 2 }},
			{name: "tos", edit: func(a, b *pkt) { b.tos = 4 }},
			{name: "ttl", edit: func(a, b *pkt) { b.ttl-- }},
			{name: "df", v4: true, edit: func(a, b *pkt) { a.df, b.df = false, false }, merge: true},
			{name: "df differs", v4: true, edit: func(a, b *pkt) { b.df = false }},
			{name: "id jump", v4: true, edit: func(a, b *pkt) { b.id += 2 }},
			{name: "fixed id with df", v4: true, merge: true, edit: func(a, b *pkt) { b.id = a.id }},
			{name: "fixed id without df", v4: true, edit: func(a, b *pkt) { a.df, b.df, b.id = false, false, a.id }},
			{name: "ip options", v4: true, edit: func(a, b *pkt) { a.ipOpts, b.ipOpts = 4, 4 }},
			{name: "flow label", v6: true, edit: func(a, b *pkt) { b.label = 9 }},
			{name: "link padding", edit: func(a, b *pkt) { b.padding = 2 }},
			{name: "gso input", edit: func(a, b *pkt) { b.gso = true }},
			{name: "partial", merge: true, edit: func(a, b *pkt) { a.csum, b.csum = csumPartial, csumPartial }},
			{name: "software verified", merge: true, edit: func(a, b *pkt) { a.csum, b.csum = csumNone, csumNone }},
			{name: "bad checksum second", edit: func(a, b *pkt) { b.csum = csumWrong }},
			{name: "bad checksum first", edit: func(a, b *pkt) { a.csum = csumWrong }},
			{name: "other port", edit: func(a, b *pkt) { b.sport++; b.seq = 9 }},
		} {
			if c.v4 && v6 || c.v6 && !v6 {
				continue
			}
			name := map[bool]string{false: "ipv4/", true: "ipv6/"}[v6] + c.name
			t.Run(name, func(t *testing.T) {
				base := basePkt(v6)
				ps := chain(base, 2, 1000)
				c.edit(&ps[0], &ps[1])
				fs, ms := frames(ps)
				out := run(t, newC(t, Config{}), fs, ms)
				if c.merge {
					if len(out) != 1 {
						t.Fatalf("%d frames, want them merged", len(out))
					}
					checkSuper(t, out[0], fs)
					return
				}
				if len(out) != 2 {
					t.Fatalf("%d frames, want 2 untouched", len(out))
				}
				for i := range out {
					if !bytes.Equal(out[i].frame, fs[i]) || out[i].meta != ms[i] {
						t.Fatalf("frame %d changed: meta %+v", i, out[i].meta)
					}
				}
			})
		}
	}
}

// checkSuper checks a super frame against the segments it came from:
// headers, Meta, checksum after completion, and that TSO cuts it back
// into the same segments.
func checkSuper(t *testing.T, o outFrame, segs [][]byte) {
	t.Helper()
	m := o.meta
	h, err := offload.Parse(o.frame, l3)
	if err != nil {
		t.Fatalf("super frame does not parse: %v", err)
	}
	want := offload.GSOTCPv4
	if h.IPv6 {
		want = offload.GSOTCPv6
	}
	if m.GSO != want || !m.NeedsCsum || int(m.CsumStart) != h.L4 || m.CsumOffset != 16 || m.DataValid {
		t.Fatalf("meta %+v for L4 at %d", m, h.L4)
	}
	if h.Len != len(o.frame) || h.Len-l3 > 65535 {
		t.Fatalf("length %d, frame %d", h.Len, len(o.frame))
	}
	if !naiveValid(complete(o.frame, m)) {
		t.Fatalf("checksum invalid after completion")
	}
	if m.ECN != (o.frame[h.L4+13]&tcpCWR != 0) {
		t.Fatalf("ECN %t, CWR %#x", m.ECN, o.frame[h.L4+13])
	}
	outs := make([][]byte, len(segs)+1)
	for i := range outs {
		outs[i] = make([]byte, 66000)
	}
	n, err := offload.Segment(o.frame, l3, int(m.GSOSize), outs)
	if err != nil || n != len(segs) {
		t.Fatalf("resegmented into %d (%v), want %d", n, err, len(segs))
	}
	for i := range n {
		if a, b := canon(outs[i]), canon(segs[i]); !bytes.Equal(a, b) {
			t.Fatalf("segment %d differs after coalescing and resegmenting\n got %x\nwant %x", i, a[:min(80, len(a))], b[:min(80, len(b))])
		}
	}
}

// canon blanks what coalescing may legitimately change in a segment:
// the checksums, the IPv4 ID (a fixed-ID flow comes back with
// incrementing IDs; TestIPv4IDs checks IDs), and the urgent pointer of a
// segment without URG, which means nothing (RFC 9293 3.1) and which
// Linux's GRO does not compare either: the head's is kept.
func canon(f []byte) []byte {
	f = bytes.Clone(f)
	h, err := offload.Parse(f, l3)
	if err != nil {
		return f
	}
	if !h.IPv6 {
		f[h.L3+4], f[h.L3+5], f[h.L3+10], f[h.L3+11] = 0, 0, 0, 0
	}
	co := h.L4 + h.CsumOffset()
	f[co], f[co+1] = 0, 0
	if h.Proto == offload.ProtoTCP && f[h.L4+13]&tcpURG == 0 {
		f[h.L4+18], f[h.L4+19] = 0, 0
	}
	return f
}

// TestIPv4IDs: incrementing IDs come back as they were after TSO.
func TestIPv4IDs(t *testing.T) {
	ps := chain(basePkt(false), 5, 700)
	fs, ms := frames(ps)
	out := run(t, newC(t, Config{}), fs, ms)
	if len(out) != 1 {
		t.Fatalf("%d frames", len(out))
	}
	outs := [][]byte{make([]byte, 2000), make([]byte, 2000), make([]byte, 2000), make([]byte, 2000), make([]byte, 2000)}
	if _, err := offload.Segment(out[0].frame, l3, int(out[0].meta.GSOSize), outs); err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		if !bytes.Equal(complete(outs[i], offload.Meta{}), fs[i]) {
			t.Fatalf("segment %d not byte-identical after TSO", i)
		}
	}
}

// TestChainEnds: a short segment or PSH ends the chain; what follows
// starts a new one.
func TestChainEnds(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(ps []pkt)
		want []int // segments per output frame
	}{
		{"all full", func(ps []pkt) {}, []int{6}},
		{"short third", func(ps []pkt) { short(ps, 2, 300) }, []int{3, 3}},
		{"psh third", func(ps []pkt) { ps[2].flags |= tcpPSH }, []int{3, 3}},
		{"psh first", func(ps []pkt) { ps[0].flags |= tcpPSH }, []int{1, 5}},
		{"fin last", func(ps []pkt) { ps[5].flags |= tcpFIN }, []int{6}},
		{"bad fourth", func(ps []pkt) { ps[3].csum = csumWrong }, []int{3, 1, 2}},
		{"pure ack between", func(ps []pkt) { short(ps, 2, 0) }, []int{2, 1, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := chain(basePkt(false), 6, 1448)
			c.edit(ps)
			fs, ms := frames(ps)
			out := run(t, newC(t, Config{}), fs, ms)
			var got []int
			k := 0
			for _, o := range out {
				n := 1
				if o.meta.GSO != offload.GSONone {
					h, _ := offload.Parse(o.frame, l3)
					n = h.Segments(int(o.meta.GSOSize))
					checkSuper(t, o, fs[k:k+n])
				} else if !bytes.Equal(o.frame, fs[k]) {
					t.Fatalf("frame %d changed", k)
				}
				k += n
				got = append(got, n)
			}
			if !equalInts(got, c.want) {
				t.Fatalf("segments per frame %v, want %v", got, c.want)
			}
		})
	}
}

// short makes segment i carry n bytes and shifts the later ones.
func short(ps []pkt, i, n int) {
	d := len(ps[i].payload) - n
	ps[i].payload = ps[i].payload[:n]
	for j := i + 1; j < len(ps); j++ {
		ps[j].seq -= uint32(d)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSizeLimit: a chain stops before its IP packet would pass 65535
// bytes.
func TestSizeLimit(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		ps := chain(basePkt(v6), 50, 1448)
		fs, ms := frames(ps)
		out := run(t, newC(t, Config{}), fs, ms)
		if len(out) != 2 {
			t.Fatalf("%d frames", len(out))
		}
		h, _ := offload.Parse(out[0].frame, l3)
		per := (65535 - (h.End - l3)) / 1448
		if got := h.Segments(1448); got != per {
			t.Fatalf("first frame holds %d segments, want %d (IP length %d)", got, per, h.Len-l3)
		}
		checkSuper(t, out[0], fs[:per])
		checkSuper(t, out[1], fs[per:])
	}
}

// TestInterleavedFlows: two flows interleaved, a UDP datagram and a
// non-IP frame between them: each flow merges, the others pass in place.
func TestInterleavedFlows(t *testing.T) {
	a := chain(basePkt(false), 4, 1000)
	bb := basePkt(true)
	bb.sport = 7
	b := chain(bb, 4, 1200)
	u := basePkt(false)
	u.udp, u.payload = true, payload(300, 1)
	var fs [][]byte
	var ms []offload.Meta
	add := func(p pkt) {
		f, m := p.frame()
		fs, ms = append(fs, f), append(ms, m)
	}
	add(a[0])
	add(b[0])
	add(u)
	fs, ms = append(fs, []byte{1, 2, 3}), append(ms, offload.Meta{})
	for i := 1; i < 4; i++ {
		add(a[i])
		add(b[i])
	}
	c := newC(t, Config{})
	out := run(t, c, fs, ms)
	if len(out) != 4 {
		t.Fatalf("%d frames", len(out))
	}
	af, _ := frames(a)
	bf, _ := frames(b)
	checkSuper(t, out[0], af)
	checkSuper(t, out[1], bf)
	if !bytes.Equal(out[2].frame, fs[2]) || !bytes.Equal(out[3].frame, fs[3]) {
		t.Fatalf("pass-through frames changed or moved")
	}
	if s := c.Stats(); s.Frames != 2 || s.Segments != 8 {
		t.Fatalf("stats %+v", s)
	}
}

// TestBounds: more flows than Flows evicts the oldest chain; more
// chains than Buffers stop merging; both counted, nothing lost.
func TestBounds(t *testing.T) {
	var fs [][]byte
	var ms []offload.Meta
	const nflows = 5
	var flows [nflows][]pkt
	for k := range nflows {
		p := basePkt(false)
		p.sport = uint16(1000 + k)
		flows[k] = chain(p, 3, 500)
	}
	for i := range 3 {
		for k := range nflows {
			f, m := flows[k][i].frame()
			fs, ms = append(fs, f), append(ms, m)
		}
	}
	c := newC(t, Config{Flows: 2, Buffers: 1})
	out := run(t, c, fs, ms)
	if len(out) > len(fs) || len(out) < len(fs)-2 {
		t.Fatalf("%d frames from %d", len(out), len(fs))
	}
	s := c.Stats()
	if s.Evicted == 0 || s.Frames > 1 {
		t.Fatalf("stats %+v: want evictions and at most one super frame", s)
	}
	total := 0
	for _, o := range out {
		h, _ := offload.Parse(o.frame, l3)
		total += h.Len - h.End
	}
	if total != nflows*3*500 {
		t.Fatalf("payload %d", total)
	}
	c2 := newC(t, Config{Buffers: 1})
	out = run(t, c2, fs, ms)
	if s := c2.Stats(); s.Frames != 1 || s.NoBuffer == 0 || len(out) != len(fs)-2 {
		t.Fatalf("one buffer: %d frames, stats %+v", len(out), s)
	}
}

// TestVerifiesOnlyToMerge: a lone CHECKSUM_NONE segment is not
// checksummed; a merged one is.
func TestVerifiesOnlyToMerge(t *testing.T) {
	p := basePkt(false)
	p.csum = csumNone
	p.payload = payload(100, 0)
	f, m := p.frame()
	c := newC(t, Config{})
	run(t, c, [][]byte{f}, []offload.Meta{m})
	if s := c.Stats(); s.Verified != 0 {
		t.Fatalf("lone segment verified: %+v", s)
	}
	ps := chain(p, 3, 100)
	fs, ms := frames(ps)
	run(t, c, fs, ms)
	if s := c.Stats(); s.Verified != 3 || s.Frames != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestSuperBufferReuse: a second batch reuses the buffers; frames of the
// first are not referenced afterwards.
func TestSuperBufferReuse(t *testing.T) {
	c := newC(t, Config{})
	for k := range 3 {
		p := basePkt(k%2 == 1)
		p.seq = uint32(k * 100000)
		fs, ms := frames(chain(p, 10, 1448))
		out := run(t, c, fs, ms)
		if len(out) != 1 {
			t.Fatalf("batch %d: %d frames", k, len(out))
		}
		checkSuper(t, out[0], fs)
	}
	if len(c.bufs) != 1 {
		t.Fatalf("%d buffers allocated for one chain per batch", len(c.bufs))
	}
	if _, err := New(Config{L3Off: -1}); err == nil {
		t.Fatalf("negative L3Off accepted")
	}
}
