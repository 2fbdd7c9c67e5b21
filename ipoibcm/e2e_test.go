package ipoibcm

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca/soft"
)

func TestPingTwoHosts(t *testing.T) {
	for _, mode := range []Mode{ModeConnected, ModeDatagram} {
		t.Run(mode.String(), func(t *testing.T) {
			tn := newTestNet(t, 2, soft.Config{Seed: 1}, func(k int, c *Config) { c.Mode = mode })
			a, b := tn.nodes[0], tn.nodes[1]
			if !a.ifc.LinkUp() || !a.host.LinkUp() {
				t.Fatal("link not up after Start")
			}
			ping(t, a, b.v4, 56)
			ping(t, b, a.v4, 56)
			ping(t, a, b.v6, 56)
			ping(t, b, a.v6, 56)
			ping(t, a, b.v4, 1800)
			st := a.ifc.Stats()
			if st.Counters.TxPackets == 0 || st.Counters.RxPackets == 0 {
				t.Fatalf("counters not moving: %+v", st.Counters)
			}
			if len(st.Neighbours) != 1 {
				t.Fatalf("neighbours = %+v, want 1", st.Neighbours)
			}
			if mode == ModeConnected && len(st.TXConns) != 1 {
				t.Fatalf("tx conns = %+v, want 1", st.TXConns)
			}
			if mode == ModeDatagram && len(st.TXConns) != 0 {
				t.Fatalf("tx conns in datagram mode: %+v", st.TXConns)
			}
			t.Logf("stats: %+v drops %v", st.Counters, st.Drops)
		})
	}
}
