package flagcheck

import (
	"strings"
	"testing"
)

func TestPKey(t *testing.T) {
	for in, want := range map[string]uint16{"0x8001": 0x8001, "0x0001": 1, "32770": 0x8002, "0xffff": 0xffff, " 0x7fff ": 0x7fff, "010": 8} {
		if got, msg := PKey("P_Key", in); msg != "" || got != want {
			t.Errorf("PKey(%q) = %#x, %q; want %#x", in, got, msg, want)
		}
	}
	for _, in := range []string{"", "0", "0x0", "0x8000", "32768", "0x10000", "-1", "pkey", "0x8001x"} {
		if _, msg := PKey("P_Key", in); msg == "" || !strings.HasPrefix(msg, "P_Key") {
			t.Errorf("PKey(%q) accepted (%q)", in, msg)
		}
	}
}

func FuzzPKey(f *testing.F) {
	for _, s := range []string{"0x8001", "0", "0x8000", "65535", "0x1_0000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, msg := PKey("P_Key", s)
		if msg == "" && k&0x7FFF == 0 {
			t.Fatalf("PKey(%q) = %#x accepted", s, k)
		}
		if msg != "" && (k != 0 || strings.Contains(msg, "\n")) {
			t.Fatalf("PKey(%q): %#x with message %q", s, k, msg)
		}
	})
}
