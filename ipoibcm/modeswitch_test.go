package ipoibcm

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca/soft"
)

func TestModeSwitchDuringTCP(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 7}, nil)
	a, b := tn.nodes[0], tn.nodes[1]
	switched := make(chan error, 2)
	tcpTransfer(t, a, b, b.v4, 32<<20, func() {
		switched <- a.ifc.SetMode(ModeDatagram)
		switched <- b.ifc.SetMode(ModeDatagram)
	})
	for range 2 {
		if err := <-switched; err != nil {
			t.Fatal(err)
		}
	}
	if a.ifc.Mode() != ModeDatagram || a.ifc.MTU() != 4092 || a.host.MTU() != 4092 {
		t.Fatalf("after switch: mode %v MTU %d host MTU %d", a.ifc.Mode(), a.ifc.MTU(), a.host.MTU())
	}
	st := a.ifc.Stats()
	if st.Reaper.ModeSwitches != 1 || len(st.TXConns) != 0 {
		t.Fatalf("mode switch left TX connections: %+v", st.TXConns)
	}
	// And back, with traffic continuing.
	if err := a.ifc.SetMode(ModeConnected); err != nil {
		t.Fatal(err)
	}
	if a.ifc.MTU() != 65520 || a.host.MTU() != 65520 {
		t.Fatalf("MTU after switching back: %d / host %d", a.ifc.MTU(), a.host.MTU())
	}
	tcpTransfer(t, a, b, b.v4, 8<<20, nil)
	if err := a.ifc.SetMode(Mode(7)); err == nil {
		t.Fatal("SetMode accepted an invalid mode")
	}
}

func TestParseMode(t *testing.T) {
	for s, want := range map[string]Mode{"datagram": ModeDatagram, "connected\n": ModeConnected} {
		if m, err := ParseMode(s); err != nil || m != want {
			t.Fatalf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("cm"); err == nil {
		t.Fatal("ParseMode accepted junk")
	}
	if ModeConnected.String() != "connected" || ModeDatagram.String() != "datagram" {
		t.Fatal("mode names")
	}
}
