package packet

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

func ipv4TCP(payload int) []byte {
	p := make([]byte, 20+20+payload)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(p[6:], 0x4000)
	p[8], p[9] = 64, ProtoTCP
	copy(p[12:20], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	p[20+12] = 5 << 4
	return p
}

func ipv6UDP(payload int) []byte {
	p := make([]byte, 40+8+payload)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], uint16(8+payload))
	p[6], p[7] = ProtoUDP, 64
	p[8], p[23], p[24], p[39] = 0xfe, 1, 0xfe, 2
	return p
}

func TestParseIP(t *testing.T) {
	v4 := ipv4TCP(100)
	h, err := ParseIP(append(v4, 0, 0)) // link padding
	if err != nil || h.IPv6 || h.HeaderLen != 20 || h.Len != 140 || h.Protocol != ProtoTCP || h.Fragment {
		t.Fatalf("ipv4: %+v %v", h, err)
	}
	v6 := ipv6UDP(10)
	h, err = ParseIP(v6)
	if err != nil || !h.IPv6 || h.HeaderLen != 40 || h.Len != 58 || h.Protocol != ProtoUDP {
		t.Fatalf("ipv6: %+v %v", h, err)
	}
	frag := ipv4TCP(0)
	binary.BigEndian.PutUint16(frag[6:], 0x2000)
	if h, err := ParseIP(frag); err != nil || !h.Fragment {
		t.Fatalf("fragment: %+v %v", h, err)
	}
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"empty":       {nil, ErrTruncated},
		"v5":          {[]byte{0x50, 0, 0, 0}, ErrNotIP},
		"v4 short":    {v4[:19], ErrTruncated},
		"v6 short":    {v6[:39], ErrTruncated},
		"v4 cut":      {v4[:139], ErrBadLength},
		"v6 cut":      {v6[:57], ErrBadLength},
		"ihl 4":       {append([]byte{0x41}, v4[1:]...), ErrBadLength},
		"ihl past":    {append([]byte{0x4f}, v4[1:40]...), ErrBadLength},
		"total < ihl": {func() []byte { b := ipv4TCP(0); b[3] = 19; return b }(), ErrBadLength},
	} {
		if _, err := ParseIP(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// A quote: the header is whole, the packet is not.
	if h, err := ParseIPHeader(v4[:48]); err != nil || h.Len != 140 {
		t.Fatalf("ParseIPHeader of a quote: %+v %v", h, err)
	}
}

func TestTransportLen(t *testing.T) {
	tcp := make([]byte, 32)
	tcp[12] = 8 << 4
	if n, err := TransportLen(ProtoTCP, tcp); n != 32 || err != nil {
		t.Fatalf("tcp with options: %d %v", n, err)
	}
	if _, err := TransportLen(ProtoTCP, tcp[:31]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("tcp options past the end: %v", err)
	}
	tcp[12] = 4 << 4
	if _, err := TransportLen(ProtoTCP, tcp); !errors.Is(err, ErrTruncated) {
		t.Fatalf("tcp data offset 16: %v", err)
	}
	if n, err := TransportLen(ProtoUDP, tcp[:8]); n != 8 || err != nil {
		t.Fatalf("udp: %d %v", n, err)
	}
	if _, err := TransportLen(ProtoUDP, tcp[:7]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("udp short: %v", err)
	}
	if _, err := TransportLen(ProtoICMPv4, tcp); !errors.Is(err, ErrNotTransport) {
		t.Fatalf("icmp: %v", err)
	}
}

func TestChecksums(t *testing.T) {
	b := make([]byte, 1501)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	for _, n := range []int{0, 1, 2, 7, 8, 63, 64, 1500, 1501} {
		if got, want := Sum(b[:n], 0), testutil.NaiveSum(b[:n]); got != want {
			t.Errorf("Sum of %d bytes = %#x, want %#x", n, got, want)
		}
	}
	// All ones stresses the carries.
	ones := make([]byte, 65535)
	for i := range ones {
		ones[i] = 0xff
	}
	if got, want := Sum(ones, 0), testutil.NaiveSum(ones); got != want {
		t.Fatalf("all ones: %#x, want %#x", got, want)
	}
	v4 := ipv4TCP(0)
	PutIPv4Checksum(v4)
	if !IPv4ChecksumValid(v4) || testutil.NaiveSum(v4[:20]) != 0xFFFF {
		t.Fatalf("ipv4 header checksum %#x does not verify", binary.BigEndian.Uint16(v4[10:]))
	}
	v4[8]--
	if IPv4ChecksumValid(v4) {
		t.Fatal("a changed TTL still verifies")
	}

	// The pseudo-header as RFC 768 and RFC 8200 lay it out, summed naively.
	v6 := ipv6UDP(3)
	ph := append(append([]byte{}, v6[8:40]...), 0, 0, 0, 11, 0, 0, 0, ProtoUDP)
	if got, want := PseudoHeaderSum(v6, true, ProtoUDP, 11), testutil.NaiveSum(ph); got != want {
		t.Fatalf("ipv6 pseudo-header %#x, want %#x", got, want)
	}
	ph = append(append([]byte{}, v4[12:20]...), 0, ProtoTCP, 0, 20)
	if got, want := PseudoHeaderSum(v4, false, ProtoTCP, 20), testutil.NaiveSum(ph); got != want {
		t.Fatalf("ipv4 pseudo-header %#x, want %#x", got, want)
	}
	ph = append(append([]byte{}, v6[8:40]...), 0, 1, 0, 4, 0, 0, 0, ProtoUDP)
	if got, want := PseudoHeaderSum(v6, true, ProtoUDP, 65540), testutil.NaiveSum(ph); got != want {
		t.Fatalf("ipv6 jumbo pseudo-header %#x, want %#x", got, want)
	}
}

func TestIPv6UpperLayer(t *testing.T) {
	ext := func(next uint8, n int) []byte { // an extension header of n bytes
		b := make([]byte, n)
		b[0], b[1] = next, byte(n/8-1)
		return b
	}
	hbh, ah := uint8(0), uint8(51)
	base := ipv6UDP(0)[:40]
	base[6] = hbh
	p := append(append([]byte{}, base...), ext(44, 16)...)                                           // hop-by-hop, 16 bytes
	p = append(p, ProtoICMPv6, 0, 0x01, 0x09, 0, 0, 0, 1)                                            // fragment, offset 0x109>>3 = 33
	ahdr := []byte{ProtoICMPv6, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // (4+2)*4 = 24
	p[56] = ah
	p = append(p, ahdr...)
	p = append(p, 128, 0) // echo request
	proto, off, frag, ok := IPv6UpperLayer(p)
	if !ok || proto != ProtoICMPv6 || off != 40+16+8+24 || frag != 33 {
		t.Fatalf("chain: proto %d off %d frag %d ok %v", proto, off, frag, ok)
	}
	if _, _, _, ok := IPv6UpperLayer(p[:40+16+8+7]); ok {
		t.Fatal("an authentication header cut inside its first eight bytes walks")
	}
	// The last header may end at the end of a quote.
	if proto, off, _, ok := IPv6UpperLayer(p[:40+16+8+24]); !ok || proto != ProtoICMPv6 || off != 88 {
		t.Fatalf("quote ending after the chain: %d %d %v", proto, off, ok)
	}
	if proto, off, frag, ok := IPv6UpperLayer(ipv6UDP(4)); !ok || proto != ProtoUDP || off != 40 || frag != 0 {
		t.Fatalf("no extension headers: %d %d %d %v", proto, off, frag, ok)
	}
}

// mldReport is an MLDv2 report to ff02::16 as hosts send it: behind a
// hop-by-hop header of eight bytes holding the Router Alert option.
func mldReport() []byte {
	p := ipv6UDP(0)[:40]
	p[6], p[7], p[24], p[25], p[39] = 0, 1, 0xff, 0x02, 0x16
	p = append(p, ProtoICMPv6, 0, 5, 2, 0, 0, 1, 0) // hop-by-hop: Router Alert (MLD), PadN
	p = append(p, 143, 0, 0, 0, 0, 0, 0, 0)         // MLDv2 report, no records
	binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
	return p
}

func TestIPv6PastHopByHop(t *testing.T) {
	p := mldReport()
	if proto, off, ok := IPv6PastHopByHop(p); !ok || proto != ProtoICMPv6 || off != 48 {
		t.Fatalf("MLD: proto %d off %d ok %v", proto, off, ok)
	}
	if _, _, ok := IPv6PastHopByHop(p[:47]); ok {
		t.Fatal("a hop-by-hop header cut inside its first eight bytes is skipped")
	}
	// It skips one hop-by-hop header and nothing else.
	p[40] = 60 // destination options next
	if proto, off, ok := IPv6PastHopByHop(p); !ok || proto != 60 || off != 48 {
		t.Fatalf("hop-by-hop then destination options: proto %d off %d ok %v", proto, off, ok)
	}
	if proto, off, ok := IPv6PastHopByHop(ipv6UDP(4)); !ok || proto != ProtoUDP || off != 40 {
		t.Fatalf("no extension headers: %d %d %v", proto, off, ok)
	}
}

// FuzzParseIP: no input panics, and what parses describes bytes that are
// there.
func FuzzParseIP(f *testing.F) {
	f.Add(ipv4TCP(10))
	f.Add(ipv6UDP(10))
	f.Add([]byte{0x4f})
	f.Add(mldReport())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseIP(b)
		hh, herr := ParseIPHeader(b)
		if err == nil {
			if herr != nil || hh != h {
				t.Fatalf("ParseIP %+v but ParseIPHeader %+v %v", h, hh, herr)
			}
			if h.HeaderLen > h.Len || h.Len > len(b) {
				t.Fatalf("%+v over %d bytes", h, len(b))
			}
			if n, err := TransportLen(h.Protocol, b[h.HeaderLen:h.Len]); err == nil && h.HeaderLen+n > h.Len {
				t.Fatalf("transport header of %d past %+v", n, h)
			}
		}
		// ParseHeaders, whose fast path is its own, agrees with ParseIP
		// and TransportLen.
		ph, perr := ParseHeaders(b, 0)
		if err == nil && !h.Fragment {
			n, terr := TransportLen(h.Protocol, b[h.HeaderLen:h.Len])
			want := Headers{IPv6: h.IPv6, Proto: h.Protocol, L4: h.HeaderLen, Len: h.Len}
			if terr == nil {
				want.End = h.HeaderLen + n
			}
			if ph != want || (perr == nil) != (terr == nil) {
				t.Fatalf("ParseHeaders %+v %v, want %+v %v", ph, perr, want, terr)
			}
		} else if perr == nil {
			t.Fatalf("ParseHeaders %+v where ParseIP %+v %v", ph, h, err)
		}
		// ReadHeaders is ParseHeaders' reading, its ip answer ParseIP's.
		rh, rip, rl4 := ReadHeaders(b, 0)
		if rh != ph || rl4 != (perr == nil) || rip != (err == nil) {
			t.Fatalf("ReadHeaders %+v ip %v l4 %v; ParseHeaders %+v %v, ParseIP %v", rh, rip, rl4, ph, perr, err)
		}
		if herr == nil && hh.HeaderLen > len(b) {
			t.Fatalf("header of %d in %d bytes", hh.HeaderLen, len(b))
		}
		if len(b) >= 40 {
			_ = PseudoHeaderSum(b, b[0]>>4 == 6, ProtoUDP, len(b))
			up, uoff, _, uok := IPv6UpperLayer(b)
			if uoff < 40 || (!uok && len(b)-uoff >= 8) {
				t.Fatalf("IPv6UpperLayer: offset %d of %d, ok %v", uoff, len(b), uok)
			}
			// IPv6PastHopByHop is IPv6UpperLayer's first step, taken
			// only for a hop-by-hop header.
			proto, off, ok := IPv6PastHopByHop(b)
			switch {
			case b[6] != 0:
				if !ok || proto != b[6] || off != 40 {
					t.Fatalf("IPv6PastHopByHop without hop-by-hop: %d %d %v", proto, off, ok)
				}
			case !ok:
				if len(b) >= 48 || uok {
					t.Fatalf("IPv6PastHopByHop refused %d bytes, IPv6UpperLayer %v", len(b), uok)
				}
			case off != 40+(int(b[41])+1)*8 || proto != b[40]:
				t.Fatalf("IPv6PastHopByHop: %d %d over %d bytes", proto, off, len(b))
			case uok && off == uoff && up != proto:
				t.Fatalf("IPv6PastHopByHop %d at %d, IPv6UpperLayer %d there", proto, off, up)
			}
		}
	})
}
