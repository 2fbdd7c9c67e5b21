package soak

import (
	"errors"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestSoakPacketRoundTrip(t *testing.T) {
	for _, size := range []int{soakMinIP, soakMinIP + 1, 1500, 9000, 65520} {
		b := make([]byte, size)
		if n := putSoakIPv4(b, 3, 17, 42, size); n != size {
			t.Fatalf("put %d: %d", size, n)
		}
		p, err := parseSoakIPv4(b)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if p.Src != 3 || p.Dst != 17 || p.Seq != 42 || p.Len != size-soakIPOverhead ||
			p.SrcIP != soakHostIP(3) || p.DstIP != soakHostIP(17) {
			t.Fatalf("size %d: parsed %+v", size, p)
		}
	}
}

func TestSoakPacketRejects(t *testing.T) {
	good := make([]byte, 200)
	putSoakIPv4(good, 1, 2, 9, len(good))
	cases := []struct {
		name   string
		mutate func(b []byte) []byte
		want   error
	}{
		{"body bit flip", func(b []byte) []byte { b[150] ^= 1; return b }, ErrChecksum},
		{"seq changed", func(b []byte) []byte { b[soakIPOverhead+15]++; return b }, ErrChecksum},
		{"ip header bit flip", func(b []byte) []byte { b[8]--; return b }, ErrChecksum},
		{"truncated", func(b []byte) []byte { return b[:100] }, ErrTruncated},
		{"not udp", func(b []byte) []byte { b[9] = 6; return b }, ErrNotOurs},
		{"other port", func(b []byte) []byte { b[header.IPv4MinimumSize+3]++; return b }, ErrNotOurs},
		{"too short", func(b []byte) []byte { return b[:10] }, ErrNotOurs},
	}
	for _, c := range cases {
		b := append([]byte(nil), good...)
		if _, err := parseSoakIPv4(c.mutate(b)); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
	if n := putSoakIPv4(make([]byte, 10), 0, 1, 1, 10); n != 0 {
		t.Fatalf("put into a short buffer wrote %d", n)
	}
}

func TestSoakHostIP(t *testing.T) {
	for _, k := range []int{0, 1, 249, 250, 251, 1000, 62499} {
		got, ok := soakHostIndex(soakHostIP(k))
		if !ok || got != k {
			t.Fatalf("host %d -> %s -> %d %v", k, soakHostIP(k), got, ok)
		}
	}
}

func FuzzParseSoakIPv4(f *testing.F) {
	good := make([]byte, 120)
	putSoakIPv4(good, 1, 2, 3, len(good))
	f.Add(good)
	f.Add(good[:40])
	f.Add([]byte{0x45})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseSoakIPv4(b)
		if err != nil {
			return
		}
		// Anything accepted re-encodes to the same bytes: the checksum
		// leaves no room for a different packet to pass.
		again := make([]byte, soakIPOverhead+p.Len)
		putSoakIPv4(again, p.Src, p.Dst, p.Seq, len(again))
		q, err := parseSoakIPv4(again)
		if err != nil || q.Seq != p.Seq || q.Src != p.Src || q.Dst != p.Dst || q.Len != p.Len {
			t.Fatalf("accepted %+v does not round-trip: %+v %v", p, q, err)
		}
	})
}
