package napi

import (
	"bytes"
	"strconv"
	"testing"
)

func TestGoroutineIDDistinguishesGoroutines(t *testing.T) {
	mine := goroutineID()
	if mine == 0 {
		t.Fatal("goroutineID returned 0: the runtime's stack header format changed")
	}
	if again := goroutineID(); again != mine {
		t.Errorf("goroutineID not stable: %d then %d", mine, again)
	}
	other := make(chan uint64)
	go func() { other <- goroutineID() }()
	if id := <-other; id == mine || id == 0 {
		t.Errorf("another goroutine got id %d, this one %d", id, mine)
	}
}

func TestParseGoroutineID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"goroutine 1 [running]:\nmain.main()", 1, true},
		{"goroutine 18446744073709551615 [running]:", 18446744073709551615, true},
		{"goroutine 18446744073709551616 [running]:", 0, false},
		{"goroutine 0 [running]:", 0, false},
		{"goroutine  [running]:", 0, false},
		{"goroutine 12", 0, false},
		{"goroutine 12x [running]:", 0, false},
		{"thread 12 [running]:", 0, false},
		{"", 0, false},
	} {
		got, err := parseGoroutineID([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseGoroutineID(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseGoroutineID(f *testing.F) {
	f.Add([]byte("goroutine 7 [running]:\n"))
	f.Add([]byte("goroutine 99999999999999999999 "))
	f.Add([]byte("goroutine "))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := parseGoroutineID(b)
		if err != nil {
			if id != 0 {
				t.Fatalf("error with id %d", id)
			}
			return
		}
		// A successful parse read "goroutine ", then digits worth id,
		// then a space.
		rest, ok := bytes.CutPrefix(b, []byte("goroutine "))
		digits, _, found := bytes.Cut(rest, []byte(" "))
		if !ok || !found {
			t.Fatalf("parsed %d from %q", id, b)
		}
		if v, err := strconv.ParseUint(string(digits), 10, 64); err != nil || v != id {
			t.Fatalf("parsed %d from %q, digits say %d (%v)", id, b, v, err)
		}
	})
}
