package tap

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
)

// tcp4Frame is an Ethernet/IPv4/TCP frame with payload bytes of data.
func tcp4Frame(payload int) []byte {
	f := make([]byte, EthHdrLen+20+20+payload)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[EthHdrLen:]
	ip[0], ip[8], ip[9] = 0x45, 64, offload.ProtoTCP
	binary.BigEndian.PutUint16(ip[2:], uint16(40+payload))
	copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	ip[20+12], ip[20+13] = 5<<4, 0x18
	for i := range payload {
		f[EthHdrLen+40+i] = byte(i)
	}
	return f
}

func tsoHdr(gsoSize uint16) VnetHdr {
	return VnetHdr{Flags: VnetNeedsCsum, GSOType: GSOTCPv4, HdrLen: EthHdrLen + 40, GSOSize: gsoSize,
		CsumStart: EthHdrLen + 20, CsumOffset: 16}
}

func TestVnetHdrRoundTrip(t *testing.T) {
	h := VnetHdr{Flags: VnetNeedsCsum | VnetDataValid, GSOType: GSOTCPv6 | GSOECN, HdrLen: 86, GSOSize: 1440, CsumStart: 54, CsumOffset: 16}
	var b [VnetHdrLen]byte
	h.Encode(b[:])
	got, ok := DecodeVnetHdr(b[:])
	if !ok || got != h {
		t.Fatalf("round trip %+v -> %+v", h, got)
	}
	if _, ok := DecodeVnetHdr(b[:VnetHdrLen-1]); ok {
		t.Fatal("short header decoded")
	}
	if h.GSOType.String() != "tcpv6|ecn" {
		t.Fatalf("gso type string %q", h.GSOType.String())
	}
}

// TestVnetValidate: each way a header can lie is refused under its own
// reason; honest headers pass.
func TestVnetValidate(t *testing.T) {
	f := tcp4Frame(3000)
	udp := tcp4Frame(3000)
	udp[EthHdrLen+9] = offload.ProtoUDP
	icmp := tcp4Frame(3000)
	icmp[EthHdrLen+9] = 1
	cases := []struct {
		name  string
		h     VnetHdr
		frame []byte
		want  VnetDrop
	}{
		{"plain", VnetHdr{}, f, VnetOK},
		{"partial csum", VnetHdr{Flags: VnetNeedsCsum, CsumStart: 34, CsumOffset: 16}, f, VnetOK},
		{"tso", tsoHdr(1448), f, VnetOK},
		{"uso", VnetHdr{Flags: VnetNeedsCsum, GSOType: GSOUDPL4, HdrLen: 42, GSOSize: 1472, CsumStart: 34, CsumOffset: 6}, udp, VnetOK},
		{"gso size 0", tsoHdr(0), f, VnetDropGSOSizeZero},
		{"hdr len past frame", VnetHdr{HdrLen: uint16(len(f) + 1)}, f, VnetDropHdrLen},
		{"csum past frame", VnetHdr{Flags: VnetNeedsCsum, CsumStart: uint16(len(f) - 1), CsumOffset: 0}, f, VnetDropCsumOffset},
		{"csum in ethernet header", VnetHdr{Flags: VnetNeedsCsum, CsumStart: 2, CsumOffset: 0}, f, VnetDropCsumOffset},
		{"tso csum elsewhere", func() VnetHdr { h := tsoHdr(1448); h.CsumOffset = 6; return h }(), f, VnetDropCsumOffset},
		{"tso on icmp", tsoHdr(1448), icmp, VnetDropNotL4},
		{"tso on udp", tsoHdr(1448), udp, VnetDropNotL4},
		{"tso6 on ipv4", func() VnetHdr { h := tsoHdr(1448); h.GSOType = GSOTCPv6; return h }(), f, VnetDropNotL4},
		{"ufo", func() VnetHdr { h := tsoHdr(1448); h.GSOType = GSOUDP; return h }(), f, VnetDropGSOType},
		{"unknown type", func() VnetHdr { h := tsoHdr(1448); h.GSOType = 9; return h }(), f, VnetDropGSOType},
		{"tso without csum", func() VnetHdr { h := tsoHdr(1448); h.Flags = 0; return h }(), f, VnetDropNoCsum},
		{"tso on runt", tsoHdr(1448), f[:10], VnetDropHdrLen},
	}
	for _, c := range cases {
		if _, got := c.h.Validate(c.frame); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	for r := VnetOK; int(r) < VnetDropReasons; r++ {
		if s := r.String(); s == "" || bytes.HasPrefix([]byte(s), []byte("VnetDrop(")) {
			t.Errorf("reason %d has no name", r)
		}
	}
}

// FuzzVnetHdr: any header bytes with any frame never panic; a header
// Validate accepts is one software GSO and checksum completion can act on
// without failing or reading out of bounds.
func FuzzVnetHdr(f *testing.F) {
	var b [VnetHdrLen]byte
	tsoHdr(1448).Encode(b[:])
	f.Add(b[:], tcp4Frame(5000))
	(VnetHdr{Flags: VnetNeedsCsum, CsumStart: 34, CsumOffset: 16}).Encode(b[:])
	f.Add(b[:], tcp4Frame(100))
	f.Add([]byte{1, 2, 3}, []byte{})
	out := make([][]byte, 64)
	for i := range out {
		out[i] = make([]byte, 1600)
	}
	f.Fuzz(func(t *testing.T, hb, frame []byte) {
		h, ok := DecodeVnetHdr(hb)
		if !ok {
			return
		}
		hd, r := h.Validate(frame)
		if r != VnetOK {
			return
		}
		if !h.IsGSO() {
			if h.NeedsCsum() {
				offload.CompletePartial(frame, int(h.CsumStart), int(h.CsumOffset))
			}
			return
		}
		// Validate proved the headers; only batch or buffer room may fail.
		n, err := offload.Segment(frame[:hd.Len], EthHdrLen, int(h.GSOSize), out)
		if err != nil && hd.Segments(int(h.GSOSize)) <= len(out) && hd.End+int(h.GSOSize) <= 1600 {
			t.Fatalf("validated header %+v failed to segment: %v", h, err)
		}
		for _, s := range out[:n] {
			if !offload.VerifyChecksums(s, EthHdrLen) {
				t.Fatal("segment fails verification")
			}
		}
		for i := range out {
			out[i] = out[i][:cap(out[i])]
		}
	})
}
