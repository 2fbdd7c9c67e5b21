package hca

import "testing"

func TestPKeyMatches(t *testing.T) {
	for _, c := range []struct {
		a, b PKey
		want bool
	}{
		{0xFFFF, 0xFFFF, true},  // both full members of the default partition
		{0xFFFF, 0x7FFF, true},  // full and limited member
		{0x7FFF, 0xFFFF, true},  // symmetric
		{0x7FFF, 0x7FFF, false}, // two limited members cannot talk
		{0x8001, 0x8002, false}, // different partitions
		{0x8001, 0x0001, true},
		{0x0001, 0x0002, false},
	} {
		if got := c.a.Matches(c.b); got != c.want {
			t.Errorf("%#04x.Matches(%#04x) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
