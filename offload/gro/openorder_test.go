package gro

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/internal/packet"
	"github.com/ipoibcm/ipoib/offload"
)

// unkeyable turns the TCP segment f into one GRO cannot key, the same
// flow's still: an IPv4 first fragment (MF set), or the segment behind an
// IPv6 destination options header. ReadHeaders reads neither as a whole
// TCP packet.
func unkeyable(f []byte, v6 bool) []byte {
	if !v6 {
		f = bytes.Clone(f)
		ip := f[l3:]
		binary.BigEndian.PutUint16(ip[6:], 0x2000) // MF, offset 0
		packet.PutIPv4Checksum(ip[:20])
		return f
	}
	ip := f[l3 : l3+40]
	out := slices.Concat(f[:l3], ip, []byte{byte(offload.ProtoTCP), 0, 1, 4, 0, 0, 0, 0}, f[l3+40:])
	oip := out[l3:]
	binary.BigEndian.PutUint16(oip[4:], binary.BigEndian.Uint16(ip[4:])+8)
	oip[6] = 60 // destination options
	return out
}

// TestOpenChainNotOvertaken: a frame GRO cannot key (an IPv4 fragment, an
// IPv6 packet behind extension headers) that may belong to an open chain's
// flow leaves after that chain, also when the chain was kept across a
// FlushOpen: FlushOpen emits every frame but the open chains', so the
// chain must end at such a frame, as it ends at any frame of its flow
// that cannot join it. Frames that cannot be of the chain's flow (UDP
// between the same hosts, TCP between others) leave it open.
func TestOpenChainNotOvertaken(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprintf("v6=%v/gather=%v", v6, gather), func(t *testing.T) { openChainNotOvertaken(t, v6, gather) })
		}
	}
}

// openChainNotOvertaken is one case of TestOpenChainNotOvertaken.
func openChainNotOvertaken(t *testing.T, v6, gather bool) {
	const mss = 1000
	c := newC(t, Config{Gather: gather})
	var out []outFrame
	emit := func(f []byte, m offload.Meta) { out = append(out, outFrame{bytes.Clone(f), m}) }
	flush := func(open bool) {
		if gather {
			vec := func(pieces [][]byte, m offload.Meta) { emit(slices.Concat(pieces...), m) }
			if open {
				c.FlushVecOpen(vec, func(int32) {})
			} else {
				c.FlushVec(vec)
			}
			return
		}
		if open {
			c.FlushOpen(emit, func(int32) {})
		} else {
			c.Flush(emit)
		}
	}
	base := basePkt(v6)
	ps := chain(base, 5, mss)
	fs, ms := frames(ps)
	for k := range 4 {
		c.Add(fs[k], ms[k])
	}
	flush(true)
	if len(out) != 0 || c.Pending() != 1 {
		t.Fatalf("after four segments: %d emitted, %d pending, want the chain kept", len(out), c.Pending())
	}

	// Neither of these can be the chain's flow: it stays open.
	udp := base
	udp.udp, udp.payload = true, payload(100, 3)
	other := base
	other.src[3]++
	other.payload = payload(mss, 4)
	for _, p := range []pkt{udp, other} {
		f, m := p.frame()
		c.Add(f, m)
	}
	flush(true)
	if len(out) != 1 || c.Pending() != 2 {
		t.Fatalf("after UDP and another host's TCP: %d emitted, %d pending, want the UDP and both chains kept", len(out), c.Pending())
	}
	out = out[:0]

	// The flow's fifth segment, unkeyable, then the end.
	u := unkeyable(fs[4], v6)
	c.Add(u, offload.Meta{})
	flush(true)
	flush(false)
	var seqs []uint32
	for _, o := range out {
		if bytes.Equal(o.frame, u) {
			seqs = append(seqs, ps[4].seq)
			continue
		}
		h, _, l4 := offload.ReadHeaders(o.frame, l3)
		src := o.frame[h.L3+12 : h.L3+16]
		want := base.src[:4]
		if v6 {
			src, want = o.frame[h.L3+8:h.L3+24], base.src[:]
		}
		if !l4 || h.Proto != offload.ProtoTCP || !bytes.Equal(src, want) {
			continue // UDP, the other host's TCP
		}
		seqs = append(seqs, binary.BigEndian.Uint32(o.frame[h.L4+4:]))
	}
	if want := []uint32{ps[0].seq, ps[4].seq}; !slices.Equal(seqs, want) {
		t.Fatalf("the flow's frames left at seqs %v, want %v (the chain, then the unkeyable segment)", seqs, want)
	}
}
