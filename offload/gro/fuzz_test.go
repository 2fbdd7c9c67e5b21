package gro

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
)

// decodeBatch cuts fuzz input into frames: each is a 2-byte length, a
// byte that picks its Meta, then the frame.
func decodeBatch(data []byte) ([][]byte, []offload.Meta) {
	var fs [][]byte
	var ms []offload.Meta
	for len(data) >= 3 && len(fs) < 256 {
		n := int(binary.BigEndian.Uint16(data))
		sel := data[2]
		data = data[3:]
		n = min(n, len(data))
		var m offload.Meta
		m.DataValid = sel&1 != 0
		if sel&2 != 0 {
			m.NeedsCsum = true
			m.CsumStart = []uint16{34, 54, 38, uint16(sel)}[sel>>3&3]
			m.CsumOffset = []uint16{16, 6, uint16(sel >> 5), 16}[sel>>5&3]
		}
		if sel&4 != 0 {
			m.GSO, m.GSOSize = offload.GSOTCPv4, uint16(sel)
		}
		fs, ms = append(fs, data[:n:n]), append(ms, m)
		data = data[n:]
	}
	return fs, ms
}

func encodeBatch(fs [][]byte, ms []offload.Meta) []byte {
	var b []byte
	for i, f := range fs {
		var sel byte
		if ms[i].DataValid {
			sel |= 1
		}
		if ms[i].NeedsCsum {
			sel |= 2
			if ms[i].CsumStart == 54 {
				sel |= 1 << 3
			}
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
		b = append(b, sel)
		b = append(b, f...)
	}
	return b
}

// FuzzCoalesce: arbitrary frames never panic the coalescer; what comes
// out is never more frames or bytes than went in; every frame out is an
// input as it was, or a super frame that parses, is at most 64 KiB of IP,
// carries valid checksums once completed and cuts back (TSO) into
// segments that were in the input. Gathering coalescers (FlushVec and
// Flush, and one fed through AddHeaders) emit exactly the copying one's
// frames.
func FuzzCoalesce(f *testing.F) {
	for _, v6 := range []bool{false, true} {
		for _, k := range []csumKind{csumValid, csumPartial, csumNone} {
			base := basePkt(v6)
			base.csum = k
			base.opts = tsOpt(1, 2)
			ps := chain(base, 6, 300)
			ps[4].flags |= tcpPSH
			f.Add(encodeBatch(frames(ps)))
		}
	}
	segBufs := make([][]byte, 300)
	for i := range segBufs {
		segBufs[i] = make([]byte, 66000)
	}
	cfg := Config{L3Off: l3, Flows: 2, Buffers: 2}
	c, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	read := newGatherTwin(f, cfg, true)
	read.read = true
	twins := []*gatherTwin{newGatherTwin(f, cfg, true), newGatherTwin(f, cfg, false), read}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, ms := decodeBatch(data)
		orig := make([][]byte, len(fs))
		inBytes := 0
		for i := range fs {
			orig[i] = bytes.Clone(fs[i])
			inBytes += len(fs[i])
		}
		for _, g := range twins {
			g.frames = g.frames[:0]
			for i := range fs {
				g.add(fs[i], ms[i])
			}
			g.flush(t, fs)
		}
		out := run(t, c, fs, ms)
		for _, g := range twins {
			g.check(t, out)
		}
		outBytes := 0
		for _, o := range out {
			outBytes += len(o.frame)
		}
		if len(out) > len(fs) || outBytes > inBytes {
			t.Fatalf("%d frames %d bytes out of %d frames %d bytes", len(out), outBytes, len(fs), inBytes)
		}
		for i := range fs {
			if !bytes.Equal(fs[i], orig[i]) {
				t.Fatalf("input frame %d modified", i)
			}
		}
		for _, o := range out {
			if isInput(o, orig, ms) {
				continue
			}
			h, err := offload.Parse(o.frame, l3)
			if err != nil || h.Proto != offload.ProtoTCP || h.Len != len(o.frame) || h.Len-l3 > 65535 {
				t.Fatalf("new frame does not parse as one TCP packet: %v", err)
			}
			if !o.meta.NeedsCsum || o.meta.GSOSize == 0 || (o.meta.GSO == offload.GSOTCPv6) != h.IPv6 {
				t.Fatalf("new frame meta %+v", o.meta)
			}
			if !offload.VerifyChecksums(complete(o.frame, o.meta), l3) {
				t.Fatalf("new frame's checksums invalid after completion")
			}
			for i := range segBufs {
				segBufs[i] = segBufs[i][:cap(segBufs[i])]
			}
			n, err := offload.Segment(o.frame, l3, int(o.meta.GSOSize), segBufs)
			if err != nil || n < 2 {
				t.Fatalf("new frame cuts into %d segments: %v", n, err)
			}
			for _, sg := range segBufs[:n] {
				if !hasCanon(sg, orig) {
					t.Fatalf("a segment cut from a new frame was not in the input")
				}
			}
		}
	})
}

func isInput(o outFrame, fs [][]byte, ms []offload.Meta) bool {
	for i := range fs {
		if ms[i] == o.meta && bytes.Equal(fs[i], o.frame) {
			return true
		}
	}
	return false
}

func hasCanon(sg []byte, fs [][]byte) bool {
	c := canon(sg)
	for _, f := range fs {
		if bytes.Equal(canon(f), c) {
			return true
		}
	}
	return false
}
