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
