package ipoibcm

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// A 65520-MTU connected-mode host sends TCP to a datagram-only peer (no
// 'C' flag) whose host believes in a large MTU too, so the MSS does not
// protect the path: the engine drops the oversize segments, answers with
// ICMP frag-needed carrying the UD MTU, and TCP converges.
func TestTCPToUDPeerConvergesByPMTU(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 5}, func(k int, c *Config) {
		if k == 1 {
			c.DisableCM = true
			c.Mode = ModeDatagram
		}
	})
	a, b := tn.nodes[0], tn.nodes[1]
	if b.ifc.HWAddr().Connected() {
		t.Fatal("datagram-only node advertises C")
	}
	if err := b.host.SetMTU(65520); err != nil {
		t.Fatal(err)
	}
	ping(t, a, b.v4, 56)
	tcpTransfer(t, a, b, b.v4, 8<<20, nil)
	st := a.ifc.Stats()
	if st.Drops["tx_too_big"] == 0 || st.Reaper.TooBigSent == 0 {
		t.Fatalf("no PMTU feedback: drops %v reaper %+v", st.Drops, st.Reaper)
	}
	if len(st.TXConns) != 0 {
		t.Fatalf("RC connection to a peer without C: %+v", st.TXConns)
	}
	t.Logf("too-big drops %d, ICMP sent %d", st.Drops["tx_too_big"], st.Reaper.TooBigSent)
	// IPv6 likewise (packet-too-big).
	tcpTransfer(t, a, b, b.v6, 4<<20, nil)
}

// A datagram-mode interface whose host believes in a larger MTU (a user
// raised the TAP's MTU, or segments were queued before a switch to
// datagram) answers oversize packets with frag-needed carrying the
// interface MTU; they are never lost silently. TCP then converges.
func TestDatagramHostAboveMTUGetsFragNeeded(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 7}, func(k int, c *Config) {
		c.Mode = ModeDatagram
	})
	a, b := tn.nodes[0], tn.nodes[1]
	// Both hosts, so the MSS exchange does not protect the path.
	for _, n := range tn.nodes {
		if err := n.host.SetMTU(65520); err != nil {
			t.Fatal(err)
		}
	}
	ping(t, a, b.v4, 56)
	tcpTransfer(t, a, b, b.v4, 4<<20, nil)
	st := a.ifc.Stats()
	if st.Drops["tx_too_big"] == 0 || st.Reaper.TooBigSent == 0 {
		t.Fatalf("no frag-needed for packets above the datagram MTU: drops %v", st.Drops)
	}
	if st.Drops["tx_oversize"] != 0 {
		t.Fatalf("oversize packets dropped silently: %d", st.Drops["tx_oversize"])
	}
}
