package tap

import (
	"errors"
	"testing"
)

func TestOwnerMarkerRoundTrip(t *testing.T) {
	m := ownerMarker{PID: 4242, Start: 987654321}
	got, err := parseOwnerMarker(m.marshal())
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got != m {
		t.Fatalf("round trip: got %+v, want %+v", got, m)
	}
}

func TestOwnerMarkerRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":       "",
		"no magic":    "pid 1\nstart 2\n",
		"other magic": "something else\npid 1\nstart 2\n",
		"zero pid":    markerMagic + "\npid 0\nstart 2\n",
		"huge pid":    markerMagic + "\npid 99999999\nstart 2\n",
		"bad start":   markerMagic + "\npid 1\nstart x\n",
		"extra line":  markerMagic + "\npid 1\nstart 2\nmore\n",
		"swapped":     markerMagic + "\nstart 2\npid 1\n",
	} {
		if _, err := parseOwnerMarker([]byte(in)); !errors.Is(err, ErrBadMarker) {
			t.Errorf("%s: err = %v, want ErrBadMarker", name, err)
		}
	}
}

func TestParseProcStartTime(t *testing.T) {
	// A command name with spaces and a parenthesis, as /proc allows.
	stat := "1234 (we ird) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 777888 1000 10 18446744073709551615\n"
	got, err := parseProcStartTime([]byte(stat))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got != 777888 {
		t.Fatalf("start = %d, want 777888", got)
	}
	if _, err := parseProcStartTime([]byte("1 (x) S 1 2")); err == nil {
		t.Fatal("short stat parsed without error")
	}
	if _, err := parseProcStartTime([]byte("no paren")); err == nil {
		t.Fatal("stat without command parsed without error")
	}
}

func TestSelfMarkerMatchesLiveProcess(t *testing.T) {
	me, err := selfMarker()
	if err != nil {
		t.Fatalf("selfMarker: %v", err)
	}
	if !processAlive(me) {
		t.Fatal("own process reported dead")
	}
	me.Start++
	if processAlive(me) {
		t.Fatal("process with a different start time reported alive (pid reuse not detected)")
	}
}

func FuzzParseOwnerMarker(f *testing.F) {
	f.Add(ownerMarker{PID: 1, Start: 2}.marshal())
	f.Add([]byte(markerMagic + "\npid 1\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseOwnerMarker(b)
		if err != nil {
			return
		}
		again, err := parseOwnerMarker(m.marshal())
		if err != nil || again != m {
			t.Fatalf("re-marshal of %+v: %+v, %v", m, again, err)
		}
	})
}

func FuzzParseProcStartTime(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseProcStartTime(b) // must not panic
	})
}
