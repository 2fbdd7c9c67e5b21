package offload

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// naiveValid checks a segment's checksums independently of the package.
func naiveValid(t *testing.T, f []byte, l3 int) {
	t.Helper()
	if err := testutil.NaiveChecksumError(f[l3:]); err != nil {
		t.Fatal(err)
	}
}

// buildPacket makes a frame: link header of l3 bytes, IPv4 (with optional
// options) or IPv6, TCP (with options) or UDP, payload. Checksums are left
// as garbage: segmentation must not trust them.
func buildPacket(r *rand.Rand, l3 int, v6, tcp bool, payload int) []byte {
	f := make([]byte, l3)
	for i := range f {
		f[i] = byte(r.Uint32())
	}
	proto := byte(ProtoUDP)
	l4len := 8
	if tcp {
		proto = ProtoTCP
		l4len = 20 + 4*r.IntN(11)
	}
	if v6 {
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(l4len+payload))
		ip[6], ip[7] = proto, 64
		for i := 8; i < 40; i++ {
			ip[i] = byte(r.Uint32())
		}
		f = append(f, ip...)
	} else {
		ihl := 20 + 4*r.IntN(3)
		ip := make([]byte, ihl)
		ip[0] = 0x40 | byte(ihl/4)
		binary.BigEndian.PutUint16(ip[2:], uint16(ihl+l4len+payload))
		binary.BigEndian.PutUint16(ip[4:], uint16(r.Uint32()))
		ip[8], ip[9] = 64, proto
		ip[10], ip[11] = 0xde, 0xad
		for i := 12; i < 20; i++ {
			ip[i] = byte(r.Uint32())
		}
		f = append(f, ip...)
	}
	l4 := make([]byte, l4len)
	for i := range l4 {
		l4[i] = byte(r.Uint32())
	}
	if tcp {
		l4[12] = byte(l4len/4) << 4
		l4[13] = tcpFIN | tcpPSH | tcpCWR | 0x10
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(8+payload))
	}
	f = append(f, l4...)
	for range payload {
		f = append(f, byte(r.Uint32()))
	}
	return f
}

func makeOut(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, size)
	}
	return out
}

// TestSegmentProperties: for random IPv4/IPv6 TCP/UDP packets behind a
// 14-byte Ethernet or 4-byte IPoIB header and random MSS, the segments
// are each at most headers+MSS, carry valid checksums (checked by a naive
// independent sum), and their payloads concatenate to the original; TCP
// sequence numbers follow the payload and FIN/PSH/CWR land where TSO puts
// them; IPv4 IDs count up.
func TestSegmentProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	out := makeOut(200, 70000)
	for iter := range 3000 {
		l3 := []int{14, 4}[iter%2]
		v6, tcp := r.IntN(2) == 0, r.IntN(2) == 0
		payload := r.IntN(64000)
		mss := 1 + r.IntN(9000)
		if iter%7 == 0 {
			mss = 1 + r.IntN(600)
		}
		f := buildPacket(r, l3, v6, tcp, payload)
		orig := bytes.Clone(f)
		for i := range out {
			out[i] = out[i][:cap(out[i])]
		}
		h, err := Parse(f, l3)
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		want := h.Segments(mss)
		if want > len(out) {
			if _, err := Segment(f, l3, mss, out); !errors.Is(err, ErrTooManySegments) {
				t.Fatalf("%d segments into %d buffers: err %v", want, len(out), err)
			}
			continue
		}
		n, err := Segment(f, l3, mss, out)
		if err != nil {
			t.Fatalf("segment v6=%t tcp=%t payload %d mss %d: %v", v6, tcp, payload, mss, err)
		}
		if n != want {
			t.Fatalf("n %d want %d", n, want)
		}
		if !bytes.Equal(f, orig) {
			t.Fatalf("input frame modified")
		}
		var got []byte
		for i, s := range out[:n] {
			if len(s) > h.End+mss {
				t.Fatalf("segment %d is %d bytes > %d", i, len(s), h.End+mss)
			}
			if !bytes.Equal(s[:l3], f[:l3]) {
				t.Fatalf("link header changed")
			}
			naiveValid(t, s, l3)
			if !VerifyChecksums(s, l3) {
				t.Fatalf("VerifyChecksums rejects segment %d", i)
			}
			sh, err := Parse(s, l3)
			if err != nil {
				t.Fatalf("segment %d does not parse: %v", i, err)
			}
			if !v6 && binary.BigEndian.Uint16(s[l3+4:]) != binary.BigEndian.Uint16(f[l3+4:])+uint16(i) {
				t.Fatalf("ipv4 id of segment %d", i)
			}
			if tcp {
				seq := binary.BigEndian.Uint32(s[sh.L4+4:])
				if seq != binary.BigEndian.Uint32(f[h.L4+4:])+uint32(len(got)) {
					t.Fatalf("segment %d seq %d", i, seq)
				}
				fl := s[sh.L4+13]
				if (fl&tcpFIN != 0) != (i == n-1) || (fl&tcpPSH != 0) != (i == n-1) || (fl&tcpCWR != 0) != (i == 0) || fl&0x10 == 0 {
					t.Fatalf("segment %d of %d flags %#x", i, n, fl)
				}
				if !bytes.Equal(s[sh.L4+14:sh.L4+16], f[h.L4+14:h.L4+16]) || !bytes.Equal(s[sh.L4+18:sh.End], f[h.L4+18:h.End]) || !bytes.Equal(s[sh.L4:sh.L4+4], f[h.L4:h.L4+4]) {
					t.Fatalf("tcp ports/window/options changed")
				}
			} else if int(binary.BigEndian.Uint16(s[sh.L4+4:])) != len(s)-sh.L4 {
				t.Fatalf("udp length")
			}
			got = append(got, s[sh.End:]...)
		}
		if !bytes.Equal(got, f[h.End:]) {
			t.Fatalf("payload differs after segmentation (v6=%t tcp=%t %d/%d)", v6, tcp, payload, mss)
		}
	}
}

// TestCompletePartial: a checksum left as the pseudo-header seed, as the
// kernel hands a NEEDS_CSUM frame, completes to the one FillChecksums
// computes from scratch.
func TestCompletePartial(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := range 500 {
		v6, tcp := iter%2 == 0, iter%3 == 0
		f := buildPacket(r, 14, v6, tcp, r.IntN(3000))
		h, err := FillChecksums(f, 14)
		if err != nil {
			t.Fatal(err)
		}
		naiveValid(t, f, 14)
		want := bytes.Clone(f)
		co := h.L4 + h.CsumOffset()
		binary.BigEndian.PutUint16(f[co:], pseudoSum(f, &h, h.Len-h.L4))
		CompletePartial(f[:h.Len], h.L4, h.CsumOffset())
		if !bytes.Equal(f, want) {
			t.Fatalf("completed %#x want %#x", f[co:co+2], want[co:co+2])
		}
	}
}

// TestVerifyRejects: any flipped byte past the link header fails
// verification (the checksum is a sum, so a single flip always shows).
func TestVerifyRejects(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := range 400 {
		f := buildPacket(r, 4, iter%2 == 0, iter%3 == 0, 1+r.IntN(2000))
		if _, err := FillChecksums(f, 4); err != nil {
			t.Fatal(err)
		}
		if !VerifyChecksums(f, 4) {
			t.Fatal("valid packet rejected")
		}
		h, _ := Parse(f, 4)
		i := h.L4 + 8 + r.IntN(h.Len-h.L4-8) // past ports and lengths
		f[i] ^= byte(1 + r.IntN(255))
		if VerifyChecksums(f, 4) {
			t.Fatalf("corrupted byte %d accepted", i)
		}
	}
}

func TestParseRejects(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	good := buildPacket(r, 14, false, true, 100)
	cases := map[string]struct {
		mut  func([]byte) []byte
		want error
	}{
		"not ip":        {func(f []byte) []byte { f[14] = 0x55; return f }, ErrNotIP},
		"icmp":          {func(f []byte) []byte { f[14+9] = 1; return f }, ErrNotL4},
		"fragment":      {func(f []byte) []byte { f[14+6] = 0x20; return f }, ErrNotL4},
		"total too big": {func(f []byte) []byte { return f[:len(f)-1] }, ErrBadLength},
		"short":         {func(f []byte) []byte { return f[:20] }, ErrTruncated},
		"tcp off past":  {func(f []byte) []byte { f[14+int(f[14]&0xF)*4+12] = 0x40; return f }, ErrTruncated},
	}
	for name, c := range cases {
		f := c.mut(bytes.Clone(good))
		if _, err := Parse(f, 14); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
	if _, err := Segment(good, 14, 0, makeOut(1, 2000)); !errors.Is(err, ErrBadMSS) {
		t.Errorf("mss 0: %v", err)
	}
	if _, err := Segment(good, 14, 50, makeOut(2, 100)); !errors.Is(err, ErrSegmentBuffer) {
		t.Errorf("small buffer: %v", err)
	}
}

// FuzzSegment: arbitrary bytes and MSS never panic, and whatever Segment
// accepts comes out as frames that verify and carry the whole payload.
func FuzzSegment(f *testing.F) {
	r := rand.New(rand.NewPCG(9, 10))
	f.Add(buildPacket(r, 14, false, true, 3000), uint16(1000), uint8(14))
	f.Add(buildPacket(r, 4, true, false, 5000), uint16(1400), uint8(4))
	f.Add([]byte{0x45}, uint16(1), uint8(0))
	out := makeOut(64, 2048)
	f.Fuzz(func(t *testing.T, frame []byte, mss uint16, l3 uint8) {
		for i := range out {
			out[i] = out[i][:cap(out[i])]
		}
		n, err := Segment(frame, int(l3%32), int(mss), out)
		if err != nil {
			return
		}
		h, _ := Parse(frame, int(l3%32))
		total := 0
		for _, s := range out[:n] {
			if !VerifyChecksums(s, h.L3) {
				t.Fatalf("segment fails verification")
			}
			total += len(s) - h.End
		}
		if total != h.Len-h.End {
			t.Fatalf("payload %d of %d", total, h.Len-h.End)
		}
		VerifyChecksums(frame, int(l3%32))
	})
}

// TestSegmentPartial: a segment left partial (csum false) completes to
// exactly the segment with full checksums, so a receiver may either hand
// it on as CHECKSUM_PARTIAL or finish it.
func TestSegmentPartial(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	full, part := make([]byte, 10000), make([]byte, 10000)
	for iter := range 300 {
		f := buildPacket(r, 4, iter%2 == 0, iter%3 != 0, r.IntN(30000))
		h, err := Parse(f, 4)
		if err != nil {
			t.Fatal(err)
		}
		mss := 100 + r.IntN(4000)
		for i := range h.Segments(mss) {
			n, err := h.SegmentInto(full, f, mss, i, true)
			if err != nil {
				t.Fatal(err)
			}
			m, err := h.SegmentInto(part, f, mss, i, false)
			if err != nil || m != n || n != h.SegmentLen(mss, i) {
				t.Fatalf("segment %d: lengths %d %d %d, err %v", i, n, m, h.SegmentLen(mss, i), err)
			}
			CompletePartial(part[:m], h.L4, h.CsumOffset())
			if !bytes.Equal(part[:m], full[:n]) {
				t.Fatalf("segment %d: completed partial differs from full", i)
			}
		}
		if _, err := h.SegmentInto(full, f, mss, h.Segments(mss), true); !errors.Is(err, ErrTooManySegments) {
			t.Fatalf("segment past the last: %v", err)
		}
	}
}

func TestCapsAccepts(t *testing.T) {
	all := Caps{Csum: true, TSO4: true, TSO6: true, USO: true}
	cases := []struct {
		c    Caps
		m    Meta
		want bool
	}{
		{Caps{}, Meta{}, true},
		{Caps{}, Meta{DataValid: true}, true},
		{Caps{}, Meta{NeedsCsum: true}, false},
		{Caps{Csum: true}, Meta{NeedsCsum: true}, true},
		{Caps{Csum: true}, Meta{GSO: GSOTCPv4, GSOSize: 1448, NeedsCsum: true}, false},
		{Caps{Csum: true, TSO4: true}, Meta{GSO: GSOTCPv4, GSOSize: 1448, NeedsCsum: true}, true},
		{Caps{Csum: true, TSO4: true}, Meta{GSO: GSOTCPv6, GSOSize: 1428, NeedsCsum: true}, false},
		{Caps{TSO4: true}, Meta{GSO: GSOTCPv4, GSOSize: 1448, NeedsCsum: true}, false},
		{all, Meta{GSO: GSOUDPL4, GSOSize: 1400, NeedsCsum: true}, true},
		{all, Meta{GSO: GSO(3), GSOSize: 1400, NeedsCsum: true}, false},
	}
	for i, c := range cases {
		if got := c.c.Accepts(c.m); got != c.want {
			t.Errorf("case %d: %+v.Accepts(%+v) = %v, want %v", i, c.c, c.m, got, c.want)
		}
	}
}

// TestSetPartialRoundTrip: a packet with valid checksums put into partial
// form and completed again is byte for byte what it was, so a verified
// checksum can be handed on as CHECKSUM_PARTIAL without changing what a
// forwarder computes.
func TestSetPartialRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := range 500 {
		f := buildPacket(r, 14, iter%2 == 0, iter%3 != 0, r.IntN(5000))
		if _, err := FillChecksums(f, 14); err != nil {
			t.Fatal(err)
		}
		want := bytes.Clone(f)
		h, err := SetPartial(f, 14)
		if err != nil {
			t.Fatal(err)
		}
		co := h.L4 + h.CsumOffset()
		if bytes.Equal(f[co:co+2], want[co:co+2]) && testutil.NaiveSum(f[h.L4:h.Len]) != 0 {
			// The seed equals the full checksum only by coincidence.
			t.Logf("iter %d: seed equals checksum", iter)
		}
		CompletePartial(f[:h.Len], h.L4, h.CsumOffset())
		if !bytes.Equal(f, want) {
			t.Fatalf("iter %d: after SetPartial+CompletePartial %#x, want %#x", iter, f[co:co+2], want[co:co+2])
		}
	}
}

// TestSegmentHeadersIntoMatchesSegmentInto: the gathering form (headers
// written, payload referenced in the frame) gives byte for byte the
// segments SegmentInto copies, checksums included, for random TCP/UDP
// packets over IPv4/IPv6 and odd payload cuts.
func TestSegmentHeadersIntoMatchesSegmentInto(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	want := make([]byte, 70000)
	hdr := make([]byte, 200)
	for iter := range 500 {
		l3 := []int{14, 4}[iter%2]
		f := buildPacket(r, l3, r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(20000))
		h, err := Parse(f, l3)
		if err != nil {
			t.Fatal(err)
		}
		mss := 1 + r.IntN(4000)
		for i := range h.Segments(mss) {
			n, err := h.SegmentInto(want, f, mss, i, true)
			if err != nil {
				t.Fatal(err)
			}
			chunk, err := h.SegmentHeadersInto(hdr, f, mss, i)
			if err != nil {
				t.Fatal(err)
			}
			got := append(append([]byte(nil), hdr[:h.End]...), chunk...)
			if !bytes.Equal(got, want[:n]) {
				t.Fatalf("iter %d segment %d (mss %d): gathered segment differs from the copied one", iter, i, mss)
			}
			naiveValid(t, got, l3)
		}
	}
	h, _ := Parse(buildPacket(r, 4, false, true, 100), 4)
	if _, err := h.SegmentHeadersInto(hdr[:h.End-1], nil, 50, 0); !errors.Is(err, ErrSegmentBuffer) {
		t.Fatalf("short header buffer: %v", err)
	}
}
