package capture

import "testing"

// TestMuxIdle: a Mux is idle (a RoCEv2 device then sends without copying
// payloads) exactly while no sink is attached.
func TestMuxIdle(t *testing.T) {
	var x Mux
	if !x.Idle() {
		t.Fatal("new Mux not idle")
	}
	detach := x.Attach(NewRing(Filter{}, 16, 1<<20))
	if x.Idle() {
		t.Fatal("Mux with a sink idle")
	}
	detach()
	if !x.Idle() {
		t.Fatal("Mux not idle again after its last sink left")
	}
}
