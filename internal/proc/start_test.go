package proc

import (
	"os"
	"testing"
)

func TestParseStartTime(t *testing.T) {
	// A command name with spaces and a parenthesis, as /proc allows.
	stat := "1234 (we ird) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 777888 1000 10 18446744073709551615\n"
	got, err := ParseStartTime([]byte(stat))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got != 777888 {
		t.Fatalf("start = %d, want 777888", got)
	}
	if _, err := ParseStartTime([]byte("1 (x) S 1 2")); err == nil {
		t.Fatal("short stat parsed without error")
	}
	if _, err := ParseStartTime([]byte("no paren")); err == nil {
		t.Fatal("stat without command parsed without error")
	}
}

func TestAliveDetectsReusedPID(t *testing.T) {
	start, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !Alive(os.Getpid(), start) {
		t.Fatal("own process reported dead")
	}
	if Alive(os.Getpid(), start+1) {
		t.Fatal("process with a different start time reported alive (pid reuse not detected)")
	}
}

func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseStartTime(b) // must not panic
	})
}
