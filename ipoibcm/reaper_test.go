package ipoibcm

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// reapSignal returns a channel that receives one value per passive
// connection of nd reaped. Installed before traffic starts.
func reapSignal(nd *testNode) chan *rxConn {
	ch := make(chan *rxConn, 1024)
	nd.ifc.mu.Lock()
	nd.ifc.hooks.rxReaped = func(rc *rxConn) { ch <- rc }
	nd.ifc.mu.Unlock()
	return ch
}

func waitN[T any](t *testing.T, ch chan T, n int, what string) []T {
	t.Helper()
	var got []T
	timeout := time.After(20 * time.Second)
	for len(got) < n {
		select {
		case v := <-ch:
			got = append(got, v)
		case <-timeout:
			t.Fatalf("%s: got %d of %d", what, len(got), n)
		}
	}
	return got
}

// staleConfig makes the passive LRU run in milliseconds.
func staleConfig(k int, c *Config) {
	c.StaleUpdate = 2 * time.Millisecond
	c.StaleAfter = 30 * time.Millisecond
	c.StaleScan = 10 * time.Millisecond
}

func TestStaleConnectionReaped(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 3}, staleConfig)
	a, b := tn.nodes[0], tn.nodes[1]
	reaped := reapSignal(b)
	ping(t, a, b.v4, 100)
	if got := len(b.ifc.Stats().RXConns); got != 1 {
		t.Fatalf("b has %d passive connections, want 1", got)
	}
	waitN(t, reaped, 1, "stale reap")
	st := b.ifc.Stats()
	r := st.Reaper
	if r.StaleReaped < 1 || r.MovedToError < 1 || r.LastWQESeen < 1 || r.DrainsPosted < 1 || r.DrainsCompleted < 1 || r.Reaped < 1 {
		t.Fatalf("reaper stats %+v", r)
	}
	if len(st.RXConns) != 0 {
		t.Fatalf("passive connections left: %+v", st.RXConns)
	}
	if st.SRQPosted != DefaultRecvQueueSize {
		t.Fatalf("SRQ posted %d, want %d (buffers leaked)", st.SRQPosted, DefaultRecvQueueSize)
	}
	// a's TX connection got the DREQ; the next ping reconnects.
	ping(t, a, b.v4, 100)
	if fs := tn.fab.Stats(); fs.DestroyedQPOps != 0 || fs.CQOverflows != 0 {
		t.Fatalf("fabric: destroyed-QP ops %d, CQ overflows %d", fs.DestroyedQPOps, fs.CQOverflows)
	}
}

// Seven peers' connections to one node go stale in the same scan: at most
// one drain WR is outstanding at a time, the RX CQ never overflows, the
// SRQ keeps every buffer.
func TestManyConnectionsReapedAtOnce(t *testing.T) {
	const n = 8
	tn := newTestNet(t, n, soft.Config{Seed: 4}, func(k int, c *Config) {
		c.RecvQueueSize = 64
		if k == 0 {
			staleConfig(k, c)
			c.StaleAfter = 200 * time.Millisecond
			c.StaleScan = 100 * time.Millisecond
		}
	})
	hub := tn.nodes[0]
	reaped := reapSignal(hub)
	for k := 1; k < n; k++ {
		ping(t, tn.nodes[k], hub.v4, 1000)
	}
	waitN(t, reaped, n-1, "reaped")
	st := hub.ifc.Stats()
	if st.Reaper.DrainsPosted >= n-1 && st.Reaper.StaleScans < n-1 {
		t.Logf("drains %d for %d connections (no batching observed)", st.Reaper.DrainsPosted, n-1)
	}
	if st.Reaper.DrainsPosted != st.Reaper.DrainsCompleted {
		t.Fatalf("drains posted %d, completed %d", st.Reaper.DrainsPosted, st.Reaper.DrainsCompleted)
	}
	if st.Reaper.CQErrors != 0 || tn.fab.Stats().CQOverflows != 0 {
		t.Fatalf("CQ overflow: %+v", st.Reaper)
	}
	if st.SRQPosted != 64 {
		t.Fatalf("SRQ posted %d, want 64", st.SRQPosted)
	}
	t.Logf("reaper: %+v", st.Reaper)
}
