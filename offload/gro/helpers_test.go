package gro

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/offload"
)

const l3 = 14 // Ethernet

// csumKind is how a test segment's checksum arrives.
type csumKind uint8

const (
	csumValid   csumKind = iota // complete, Meta.DataValid (the HCA verified it)
	csumPartial                 // pseudo-header seed, Meta.NeedsCsum
	csumNone                    // complete, zero Meta (verify in software)
	csumWrong                   // complete but wrong, zero Meta
)

// pkt describes one TCP segment (or, with udp, a UDP datagram) behind an
// Ethernet header.
type pkt struct {
	v6       bool
	udp      bool
	link     [14]byte
	src, dst [16]byte // IPv4 in the first 4 bytes
	sport    uint16
	dport    uint16
	tos, ttl uint8 // IPv6: traffic class, hop limit
	label    uint32
	id       uint16
	df       bool
	ipOpts   int // IPv4 option bytes (multiple of 4)
	seq, ack uint32
	flags    byte
	win      uint16
	opts     []byte // TCP options, multiple of 4
	payload  []byte
	csum     csumKind
	gso      bool // claim the frame is a GSO frame
	padding  int  // link padding after the IP packet
}

func basePkt(v6 bool) pkt {
	p := pkt{v6: v6, sport: 40000, dport: 5201, ttl: 64, flags: 0x10, win: 512, df: true, seq: 1000, ack: 77}
	copy(p.link[:], []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2})
	if v6 {
		p.link[12], p.link[13] = 0x86, 0xdd
		p.src = [16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
		p.dst = [16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}
	} else {
		p.link[12], p.link[13] = 0x08, 0x00
		p.src = [16]byte{10, 77, 0, 1}
		p.dst = [16]byte{10, 77, 0, 2}
	}
	return p
}

// frame builds the frame and its Meta.
func (p pkt) frame() ([]byte, offload.Meta) {
	f := append([]byte(nil), p.link[:]...)
	l4len := 20 + len(p.opts)
	proto := byte(offload.ProtoTCP)
	if p.udp {
		l4len, proto = 8, offload.ProtoUDP
	}
	if p.v6 {
		ip := make([]byte, 40)
		binary.BigEndian.PutUint32(ip, 6<<28|uint32(p.tos)<<20|p.label&0xFFFFF)
		binary.BigEndian.PutUint16(ip[4:], uint16(l4len+len(p.payload)))
		ip[6], ip[7] = proto, p.ttl
		copy(ip[8:], p.src[:])
		copy(ip[24:], p.dst[:])
		f = append(f, ip...)
	} else {
		ihl := 20 + p.ipOpts
		ip := make([]byte, ihl)
		ip[0] = 0x40 | byte(ihl/4)
		ip[1] = p.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(ihl+l4len+len(p.payload)))
		binary.BigEndian.PutUint16(ip[4:], p.id)
		if p.df {
			ip[6] = 0x40
		}
		ip[8], ip[9] = p.ttl, proto
		copy(ip[12:], p.src[:4])
		copy(ip[16:], p.dst[:4])
		for i := 20; i < ihl; i++ {
			ip[i] = 1 // NOP
		}
		f = append(f, ip...)
	}
	l4 := make([]byte, l4len)
	binary.BigEndian.PutUint16(l4, p.sport)
	binary.BigEndian.PutUint16(l4[2:], p.dport)
	if p.udp {
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(p.payload)))
	} else {
		binary.BigEndian.PutUint32(l4[4:], p.seq)
		binary.BigEndian.PutUint32(l4[8:], p.ack)
		l4[12] = byte(l4len/4) << 4
		l4[13] = p.flags
		binary.BigEndian.PutUint16(l4[14:], p.win)
		copy(l4[20:], p.opts)
	}
	f = append(f, l4...)
	f = append(f, p.payload...)
	h, err := offload.FillChecksums(f, l3)
	if err != nil {
		panic(err)
	}
	var m offload.Meta
	switch p.csum {
	case csumValid:
		m.DataValid = true
	case csumPartial:
		h.FillPartial(f)
		m = offload.Meta{NeedsCsum: true, CsumStart: uint16(h.L4), CsumOffset: uint16(h.CsumOffset())}
	case csumWrong:
		f[h.L4+h.CsumOffset()] ^= 0x5a
	}
	if p.gso {
		m.GSO, m.GSOSize = offload.GSOTCPv4, 100
		if p.v6 {
			m.GSO = offload.GSOTCPv6
		}
	}
	f = append(f, make([]byte, p.padding)...)
	return f, m
}

// tsOpt is NOP, NOP, timestamps.
func tsOpt(val, ecr uint32) []byte {
	o := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(o[4:], val)
	binary.BigEndian.PutUint32(o[8:], ecr)
	return o
}

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// outFrame is one frame Flush emitted, copied.
type outFrame struct {
	frame []byte
	meta  offload.Meta
}

// run coalesces frames in one batch and returns copies of what Flush
// emits.
func run(t testing.TB, c *Coalescer, frames [][]byte, metas []offload.Meta) []outFrame {
	t.Helper()
	for i := range frames {
		c.Add(frames[i], metas[i])
	}
	var out []outFrame
	c.Flush(func(f []byte, m offload.Meta) {
		out = append(out, outFrame{bytes.Clone(f), m})
	})
	if c.Pending() != 0 {
		t.Fatalf("Pending %d after Flush", c.Pending())
	}
	return out
}

func newC(t testing.TB, cfg Config) *Coalescer {
	t.Helper()
	if cfg.L3Off == 0 {
		cfg.L3Off = l3
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// naiveValid reports whether a complete frame's IPv4 header and TCP/UDP
// checksums are right, checked independently of the package.
func naiveValid(f []byte) bool { return testutil.NaiveChecksumError(f[l3:]) == nil }

// complete returns a copy of a NeedsCsum frame with its checksum finished.
func complete(f []byte, m offload.Meta) []byte {
	f = bytes.Clone(f)
	if m.NeedsCsum {
		offload.CompletePartial(f, int(m.CsumStart), int(m.CsumOffset))
	}
	return f
}

// gatherTwin is a Config.Gather coalescer run beside a copying one on the
// same input: each batch it flushes with FlushVec or with Flush, and
// check compares its frames with the copying coalescer's.
type gatherTwin struct {
	c   *Coalescer
	vec bool
	// read: frames go in through AddHeaders with offload.ReadHeaders'
	// reading, as the engine's receive path hands them over.
	read   bool
	frames []outFrame
	// zeroCopy counts payload pieces FlushVec handed out that lie inside
	// an input frame (not copied).
	zeroCopy int
}

func newGatherTwin(t testing.TB, cfg Config, vec bool) *gatherTwin {
	cfg.Gather = true
	return &gatherTwin{c: newC(t, cfg), vec: vec}
}

// add takes one input frame, through Add or AddHeaders.
func (g *gatherTwin) add(f []byte, m offload.Meta) {
	if !g.read {
		g.c.Add(f, m)
		return
	}
	h, _, l4 := offload.ReadHeaders(f, g.c.l3off)
	g.c.AddHeaders(f, m, h, l4, -1)
}

// openFeed feeds a coalescer batches that go on (FlushOpen): it gives the
// coalescer its own copy of every input, tagged with its index, and
// after each FlushOpen scribbles over every copy no open chain holds any
// more, so a coalescer that kept using a frame it did not report emits
// garbage, which the property checks catch.
type openFeed struct {
	c         *Coalescer
	copies    [][]byte
	held      []bool
	scribbled []bool
}

func newOpenFeed(c *Coalescer, n int) *openFeed {
	return &openFeed{c: c, copies: make([][]byte, 0, n), held: make([]bool, n), scribbled: make([]bool, n)}
}

// add hands the coalescer a copy of input f.
func (o *openFeed) add(f []byte, m offload.Meta) {
	k := len(o.copies)
	o.copies = append(o.copies, bytes.Clone(f))
	h, _, l4 := offload.ReadHeaders(o.copies[k], o.c.l3off)
	o.c.AddHeaders(o.copies[k], m, h, l4, int32(k))
}

// mark is FlushOpen's held.
func (o *openFeed) mark(tag int32) { o.held[tag] = true }

// release scribbles over what the last FlushOpen did not report held.
func (o *openFeed) release() {
	for k, f := range o.copies {
		if !o.held[k] && !o.scribbled[k] {
			for i := range f {
				f[i] = 0xEE
			}
			o.scribbled[k] = true
		}
		o.held[k] = false
	}
}

// flush ends the batch, whose input frames are in, and keeps copies of
// what comes out.
func (g *gatherTwin) flush(t testing.TB, in [][]byte) {
	t.Helper()
	g.flushOpen(t, in, nil)
}

// flushOpen is flush, with FlushOpen or FlushVecOpen when held is set.
func (g *gatherTwin) flushOpen(t testing.TB, in [][]byte, held func(int32)) {
	t.Helper()
	if !g.vec {
		emit := func(f []byte, m offload.Meta) { g.frames = append(g.frames, outFrame{bytes.Clone(f), m}) }
		if held != nil {
			g.c.FlushOpen(emit, held)
			return
		}
		g.c.Flush(emit)
		return
	}
	emit := func(pieces [][]byte, m offload.Meta) {
		if len(pieces) == 0 || (m.GSO == offload.GSONone && len(pieces) != 1) {
			t.Fatalf("FlushVec: %d pieces for meta %+v", len(pieces), m)
		}
		var f []byte
		for k, p := range pieces {
			if k > 0 {
				if !inside(p, in) {
					t.Fatalf("FlushVec: payload piece %d of %d is not in an input frame (copied)", k, len(pieces))
				}
				g.zeroCopy++
			}
			f = append(f, p...)
		}
		g.frames = append(g.frames, outFrame{f, m})
	}
	if held != nil {
		g.c.FlushVecOpen(emit, held)
		return
	}
	g.c.FlushVec(emit)
}

// check fails unless the twin emitted exactly want, frame by frame.
func (g *gatherTwin) check(t testing.TB, want []outFrame) {
	t.Helper()
	if len(g.frames) != len(want) {
		t.Fatalf("gather (vec %v): %d frames, copying coalescer %d", g.vec, len(g.frames), len(want))
	}
	for i := range want {
		if !bytes.Equal(g.frames[i].frame, want[i].frame) || g.frames[i].meta != want[i].meta {
			t.Fatalf("gather (vec %v): frame %d differs from the copying coalescer's", g.vec, i)
		}
	}
}

// inside reports whether p lies within one of the frames.
func inside(p []byte, frames [][]byte) bool {
	if len(p) == 0 {
		return false
	}
	a := uintptr(unsafe.Pointer(&p[0]))
	for _, f := range frames {
		if len(f) == 0 {
			continue
		}
		b := uintptr(unsafe.Pointer(&f[0]))
		if a >= b && a+uintptr(len(p)) <= b+uintptr(len(f)) {
			return true
		}
	}
	return false
}
