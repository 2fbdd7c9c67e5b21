package testutil

import "testing"

// TestNaiveSum: RFC 1071's worked example (section 3), split anywhere.
func TestNaiveSum(t *testing.T) {
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	for k := range len(b) + 1 {
		if got := NaiveSum(b[:k], b[k:]); got != 0xddf2 {
			t.Fatalf("split at %d: %#04x, want 0xddf2", k, got)
		}
	}
}

// TestNaiveChecksumError: an IPv4/UDP packet with both checksums right
// passes; a bit flipped in the header or the payload is named.
func TestNaiveChecksumError(t *testing.T) {
	p := []byte{
		0x45, 0, 0, 30, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, // IPv4
		0x12, 0x34, 0x56, 0x78, 0, 10, 0, 0, // UDP, length 10
		'h', 'i',
	}
	c := ^NaiveSum(p[:20])
	p[10], p[11] = byte(c>>8), byte(c)
	pseudo := append(append([]byte(nil), p[12:20]...), 0, 17, 0, 10)
	c = ^NaiveSum(pseudo, p[20:])
	p[26], p[27] = byte(c>>8), byte(c)
	if err := NaiveChecksumError(p); err != nil {
		t.Fatal(err)
	}
	for _, at := range []int{8, 29} {
		q := append([]byte(nil), p...)
		q[at] ^= 0x10
		if err := NaiveChecksumError(q); err == nil {
			t.Fatalf("bit flipped at %d not seen", at)
		}
	}
}
