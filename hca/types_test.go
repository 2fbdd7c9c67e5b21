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
		{0x0001, 0x8001, true},
		{0x0001, 0x0001, false},
		{0x0001, 0x0002, false},
		{0x8001, 0x8001, true},
		// The invalid P_Key (low 15 bits zero) matches nothing, itself
		// included, whatever the membership bit (IBTA 10.9.1.2).
		{0x8000, 0x8000, false},
		{0x8000, 0x0000, false},
		{0x0000, 0x8000, false},
		{0x0000, 0x0000, false},
	} {
		if got := c.a.Matches(c.b); got != c.want {
			t.Errorf("%#04x.Matches(%#04x) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestPKeyIndex(t *testing.T) {
	table := []PKey{0xFFFF, 0x0001, 0x8002, 0x0002, 0x8001}
	for _, c := range []struct {
		k    PKey
		want int
		ok   bool
	}{
		{0xFFFF, 0, true},
		{0x7FFF, 0, true}, // the partition, whatever k's membership
		{0x8001, 4, true}, // the full member entry is preferred
		{0x0001, 4, true},
		{0x8002, 2, true},
		{0x8003, 0, false},
		{0x8000, 0, false}, // invalid
		{0x0000, 0, false},
	} {
		i, ok := PKeyIndex(table, c.k)
		if i != c.want || ok != c.ok {
			t.Errorf("PKeyIndex(%#04x) = %d, %v; want %d, %v", c.k, i, ok, c.want, c.ok)
		}
	}
	if i, ok := PKeyIndex([]PKey{0xFFFF, 0x0005}, 0x8005); i != 1 || !ok {
		t.Errorf("limited-only partition: index %d, %v; want 1, true", i, ok)
	}
	for _, c := range []struct {
		k    PKey
		want int
		ok   bool
	}{
		{0x8001, 1, true},  // the first entry it matches: the limited 0x0001 lets a full member in
		{0x0001, 4, true},  // a limited packet needs the full entry
		{0x0003, 0, false}, // no partition 3
	} {
		i, ok := MatchingPKeyIndex(table, c.k)
		if i != c.want || ok != c.ok {
			t.Errorf("MatchingPKeyIndex(%#04x) = %d, %v; want %d, %v", c.k, i, ok, c.want, c.ok)
		}
	}
}
