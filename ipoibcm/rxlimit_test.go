package ipoibcm

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// Beyond MaxRXConns a REQ from a GID without a connection is rejected
// NO_QP and counted; the peer is still served over UD. Every REQ the CM
// handed over is accepted or counted rejected.
func TestRXConnLimit(t *testing.T) {
	tn := newTestNet(t, 3, soft.Config{Seed: 21}, func(k int, c *Config) {
		if k == 0 {
			c.MaxRXConns = 1
		}
	})
	hub := tn.nodes[0]
	ping(t, tn.nodes[1], hub.v4, 100)
	ping(t, tn.nodes[2], hub.v4, 100) // rejected NO_QP, served over UD
	st := hub.ifc.Stats()
	l := st.RXLimits
	if l.RejectedLimit != 1 || l.Conns != 1 || l.MaxConns != 1 || len(st.RXConns) != 1 || st.Reaper.RXAccepted != 1 {
		t.Fatalf("limits %+v, passive conns %d, accepted %d", l, len(st.RXConns), st.Reaper.RXAccepted)
	}
	if got := st.CM.RejSent[cm.RejectNoQP]; got != 1 {
		t.Fatalf("REJ NO_QP sent %d", got)
	}
	explained := st.Reaper.RXAccepted + st.Reaper.RXRejectedNoQP + l.RejectedLimit + l.RejectedGIDLimit + l.RejectedDown + l.RejectedError
	if explained != st.CM.REQs[cm.REQToListener] {
		t.Fatalf("%d REQs to the listener, %d explained (%+v)", st.CM.REQs[cm.REQToListener], explained, l)
	}
}

// A peer that restarts with a new QPN while its old connection is still
// established (so no STALE_CONN) reconnects although its GID is at
// MaxRXConnsPerGID: the old connection is replaced.
func TestRXConnPerGIDLimitReplacesRestartedPeer(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 22}, func(k int, c *Config) {
		if k == 0 {
			c.MaxRXConnsPerGID = 1
		}
	})
	a, b := tn.nodes[0], tn.nodes[1]
	reaped := reapSignal(a)
	ping(t, b, a.v4, 100)
	if st := a.ifc.Stats(); len(st.RXConns) != 1 {
		t.Fatalf("passive conns before restart: %d", len(st.RXConns))
	}
	gid := b.dev.Port().GID
	// A crash: the device goes first, so no DREQ leaves.
	b.dev.Close()
	b.ifc.Close()
	dev, err := tn.fab.NewDeviceWithGID("hca1-restarted", gid)
	if err != nil {
		t.Fatal(err)
	}
	// Occupy the old QPNs so the new interface's RC QP differs from the
	// old one: the REQ is not STALE_CONN.
	for range 4 {
		if _, err := dev.CreateQP(hcaUDConfig(t, dev)); err != nil {
			t.Fatal(err)
		}
	}
	// A new process draws new comm IDs and TIDs.
	nb := tn.addNodeOn(1, dev, func(_ int, c *Config) { c.CM.Seed = 99 })
	deadline := time.Now().Add(10 * time.Second)
	for {
		ping(t, nb, a.v4, 100)
		if st := nb.ifc.Stats(); st.Reaper.TXEstablished == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted peer never connected: %+v", nb.ifc.Stats().Reaper)
		}
	}
	waitN(t, reaped, 1, "replaced connection reaped")
	st := a.ifc.Stats()
	if st.RXLimits.Replaced != 1 || st.RXLimits.RejectedGIDLimit != 0 || st.RXLimits.Conns != 1 || len(st.RXConns) != 1 {
		t.Fatalf("limits %+v, passive conns %d, cm %+v, reaper %+v", st.RXLimits, len(st.RXConns), st.CM, st.Reaper)
	}
}
