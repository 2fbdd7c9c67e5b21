package ipoibcm

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// TestModeSwitchDuringTCP switches both ends mid-transfer and back. The
// host learns the smaller MTU before the engine switches (switchMode) and
// cuts what it had queued (tap/netstack), so the only frames the switch
// may drop as too big are those the host reader had already taken, at
// most one batch; before, every frame read in between was dropped with
// ICMP and gVisor's TCP took 100-200 timeouts, 20-45 s, to recover the
// lost tail at the new MSS.
//
// How many retransmission timeouts the transfer sees is logged, not
// asserted: it follows from how many frames the reader happened to hold
// at the switch, and on a loaded machine a full batch (9 timeouts for 23
// frames, seen 1 run in 10) is as correct as none.
func TestModeSwitchDuringTCP(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 7}, nil)
	a, b := tn.nodes[0], tn.nodes[1]
	switched := make(chan error, 2)
	timeouts := a.host.Stack().Stats().TCP.Timeouts
	took := tcpTransfer(t, a, b, b.v4, 32<<20, func() {
		switched <- a.ifc.SetMode(ModeDatagram)
		switched <- b.ifc.SetMode(ModeDatagram)
	})
	for range 2 {
		if err := <-switched; err != nil {
			t.Fatal(err)
		}
	}
	st, hc := a.ifc.Stats(), a.host.Counters()
	t.Logf("32 MiB across the switch in %v: %d RTOs, tx_too_big %d, host cut %d queued segments, dropped %d stale PMTU messages",
		took, timeouts.Value(), st.Drops["tx_too_big"], hc.TxResegmented, hc.RxDroppedStalePMTU)
	if batch := uint64(a.host.BatchSize()); st.Drops["tx_too_big"] > batch {
		t.Fatalf("the switch dropped %d frames as too big, more than the reader's batch of %d", st.Drops["tx_too_big"], batch)
	}
	if hc.RxDroppedStalePMTU > st.Drops["tx_too_big"] {
		t.Fatalf("host dropped %d stale PMTU messages for %d frames answered", hc.RxDroppedStalePMTU, st.Drops["tx_too_big"])
	}
	if a.ifc.Mode() != ModeDatagram || a.ifc.MTU() != 4092 || a.host.MTU() != 4092 {
		t.Fatalf("after switch: mode %v MTU %d host MTU %d", a.ifc.Mode(), a.ifc.MTU(), a.host.MTU())
	}
	st = a.ifc.Stats()
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
	t.Logf("8 MiB after switching back in %v", tcpTransfer(t, a, b, b.v4, 8<<20, nil))
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
