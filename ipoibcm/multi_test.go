package ipoibcm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
)

func TestEightHostsPingAll(t *testing.T) {
	tn := newTestNet(t, 8, soft.Config{Seed: 14}, func(k int, c *Config) {
		c.RecvQueueSize = 64
		if k%2 == 1 {
			c.Mode = ModeDatagram
		}
	})
	for _, from := range tn.nodes {
		for _, to := range tn.nodes {
			if from != to {
				ping(t, from, to.v4, 200)
			}
		}
	}
	st := tn.nodes[0].ifc.Stats()
	// node0 (connected) connects to all 7: datagram-mode nodes still
	// listen. Only the 3 other connected nodes connect to it.
	if len(st.Neighbours) != 7 || len(st.TXConns) != 7 || len(st.RXConns) != 3 {
		t.Fatalf("node0: %d neighbours, %d TX / %d RX conns; want 7, 7, 3", len(st.Neighbours), len(st.TXConns), len(st.RXConns))
	}
}

func TestUDPMulticast(t *testing.T) {
	tn := newTestNet(t, 3, soft.Config{Seed: 15}, nil)
	group := netip.MustParseAddr("239.1.2.3")
	var conns []interface{ Close() error }
	recv := make(chan string, 8)
	for _, nd := range tn.nodes[1:] {
		if err := nd.host.JoinMulticast(group); err != nil {
			t.Fatal(err)
		}
		c, err := nd.host.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), 7000))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		go func() {
			buf := make([]byte, 2000)
			for {
				n, _, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				recv <- string(buf[:n])
			}
		}()
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	s, err := tn.nodes[0].host.DialUDP(netip.AddrPortFrom(group, 7000))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Joins are asynchronous (IGMP report -> attach); resend until both
	// members have one copy.
	got := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(10 * time.Second)
	for got < 2 {
		select {
		case <-tick.C:
			s.Write([]byte("hello group"))
		case m := <-recv:
			if m != "hello group" {
				t.Fatalf("got %q", m)
			}
			got++
		case <-timeout:
			t.Fatalf("multicast: %d of 2 members got the datagram; node1 drops %v", got, tn.nodes[1].ifc.Stats().Drops)
		}
	}
	if tn.nodes[1].ifc.Stats().Counters.Multicast == 0 {
		t.Fatal("multicast counter did not move")
	}
}

// Without SRQ every passive connection has its own ring; beyond
// MaxNonSRQConns the REQ is rejected with NO_QP and the peer falls back
// to UD; teardown counts the flushed ring down instead of draining.
func TestNonSRQLimitAndTeardown(t *testing.T) {
	tn := newTestNet(t, 3, soft.Config{Seed: 16}, func(k int, c *Config) {
		c.RecvQueueSize = 16
		if k == 0 {
			c.DisableSRQ = true
			c.MaxNonSRQConns = 1
			staleConfig(k, c)
			c.StaleAfter = time.Hour
		}
	})
	hub := tn.nodes[0]
	reaped := reapSignal(hub)
	ping(t, tn.nodes[1], hub.v4, 100)
	ping(t, tn.nodes[2], hub.v4, 100) // rejected NO_QP, served over UD
	st := hub.ifc.Stats()
	if st.Reaper.RXRejectedNoQP != 1 || len(st.RXConns) != 1 {
		t.Fatalf("rejects %d, passive conns %d", st.Reaper.RXRejectedNoQP, len(st.RXConns))
	}
	if n2 := tn.nodes[2].ifc.Stats(); n2.Reaper.TXConnectFailures != 1 {
		t.Fatalf("node2 connect failures %d", n2.Reaper.TXConnectFailures)
	}
	killPassive(hub)
	waitN(t, reaped, 1, "non-SRQ reap")
	if st := hub.ifc.Stats(); st.Reaper.DrainsPosted != 0 || len(st.RXConns) != 0 {
		t.Fatalf("non-SRQ teardown used a drain or left conns: %+v", st.Reaper)
	}
}
