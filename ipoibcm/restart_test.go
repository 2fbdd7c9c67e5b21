package ipoibcm

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// A peer restarts: its Interface, host and device go away without any
// DREQ, and a new device comes up on the same GID. It must be reachable
// again within a second of its return, in both directions.
func TestPeerRestartReachableWithinOneSecond(t *testing.T) {
	for _, first := range []string{"survivor-pings", "restarted-pings"} {
		t.Run(first, func(t *testing.T) {
			tn := newTestNet(t, 2, soft.Config{Seed: 6}, nil)
			a, b := tn.nodes[0], tn.nodes[1]
			ping(t, a, b.v4, 100)
			ping(t, b, a.v4, 100)
			gid := b.dev.Port().GID
			oldQPN := b.ifc.HWAddr().QPN()
			// Occupy the old QPN range so the new interface gets another UD QPN.
			b.ifc.Close()
			b.dev.Close()
			dev, err := tn.fab.NewDeviceWithGID("hca1-restarted", gid)
			if err != nil {
				t.Fatal(err)
			}
			if first == "survivor-pings" {
				// Different UD QPN than before: the survivor's neighbour entry is stale.
				if _, err := dev.CreateQP(hcaUDConfig(t, dev)); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			nb := tn.addNodeOn(1, dev, nil)
			t.Logf("old UD QPN %#x, new %#x", oldQPN, nb.ifc.HWAddr().QPN())
			if first == "survivor-pings" {
				ping(t, a, nb.v4, 100)
			} else {
				ping(t, nb, a.v4, 100)
				ping(t, a, nb.v4, 100)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("reachable after %v, want < 1s", d)
			} else {
				t.Logf("reachable after %v", d)
			}
			tcpTransfer(t, a, nb, nb.v4, 1<<20, nil)
		})
	}
}
