package ipoibcm

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// TestConnIdleIsLastActivity: a connection's idle_ms is the time since it
// last carried a packet, both ways, while the passive LRU stamp (lru_ms)
// keeps Linux's 256 s refresh; an RX connection shows the MTU we
// advertised.
func TestConnIdleIsLastActivity(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 3}, func(k int, c *Config) { c.Mode = ModeConnected })
	a, b := tn.nodes[0], tn.nodes[1]
	ping(t, a, b.v4, 3000)
	const quiet = 300 * time.Millisecond
	time.Sleep(quiet) // the idle time being measured, not a wait for an event
	st := a.ifc.Stats()
	if len(st.TXConns) != 1 || st.TXConns[0].IdleMS < quiet.Milliseconds() {
		t.Fatalf("after %v without traffic, a's TX connections %+v: want one idle at least that long", quiet, st.TXConns)
	}
	ping(t, a, b.v4, 3000)
	tx := a.ifc.Stats().TXConns
	rx := b.ifc.Stats().RXConns
	if len(tx) != 1 || tx[0].IdleMS >= quiet.Milliseconds() || tx[0].AgeMS < quiet.Milliseconds() {
		t.Fatalf("a's TX connection right after a ping: %+v; want idle under %v, age over it", tx, quiet)
	}
	var live *ConnInfo
	for k := range rx {
		if rx[k].PeerGID == a.ifc.HWAddr().GID().String() {
			live = &rx[k]
		}
	}
	if live == nil {
		t.Fatalf("b has no RX connection from a: %+v", rx)
	}
	if live.IdleMS >= quiet.Milliseconds() || live.LRUMS < quiet.Milliseconds() || live.MTU != frame.CMBufSize {
		t.Fatalf("b's RX connection right after a ping: %+v; want idle under %v, the LRU stamp older (refreshed every 256 s), MTU %d",
			*live, quiet, frame.CMBufSize)
	}
}
