package ipoibcm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// addPartitionNode adds node k on a new device whose P_Key table is
// table, its interface in partition pkey.
func (tn *testNet) addPartitionNode(k int, table []hca.PKey, pkey hca.PKey, tweak func(c *Config)) *testNode {
	tn.t.Helper()
	dev, err := tn.fab.NewDevice(fmt.Sprintf("hca%d", k))
	if err != nil {
		tn.t.Fatal(err)
	}
	if err := dev.SetPKeyTable(table); err != nil {
		tn.t.Fatal(err)
	}
	return tn.addNodeOn(k, dev, func(_ int, c *Config) {
		c.PKey = pkey
		if tweak != nil {
			tweak(c)
		}
	})
}

// unreachable pings to from `from` for a while and fails the test if an
// echo comes back.
func unreachable(t *testing.T, from *testNode, to *testNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := from.host.Ping(ctx, to.v4, 8000); err == nil {
		t.Fatalf("%s reached %s across partitions", from.v4, to.v4)
	}
}

// knowStatically makes from's host and interface know to's addresses, as
// if from had been in to's partition before: its packets then go to to's
// port instead of dying at an MGID nobody there joined.
func knowStatically(t *testing.T, from, to *testNode) {
	t.Helper()
	mac := rvLearn(from.ifc, to.ifc.HWAddr(), to.v4, time.Now())
	err := from.host.Stack().AddStaticNeighbor(1, ipv4.ProtocolNumber, tcpip.AddrFrom4(to.v4.As4()), tcpip.LinkAddress(mac[:]))
	if err != nil {
		t.Fatalf("static neighbour: %v", err)
	}
}

// TestPartitionsSeparate: hosts of 0x8001 reach each other in both modes,
// with MGIDs, QPs and CM in that partition; a host of 0x8002 reaches
// none of them, even knowing their addresses, and what it sends is
// counted as wrong P_Key at the receiver.
func TestPartitionsSeparate(t *testing.T) {
	tn := newTestNet(t, 0, soft.Config{Seed: 31}, nil)
	a := tn.addPartitionNode(0, []hca.PKey{0xFFFF, 0x8001}, 0x8001, nil)
	b := tn.addPartitionNode(1, []hca.PKey{0xFFFF, 0x8002, 0x8001}, 0x8001, nil)
	c := tn.addPartitionNode(2, []hca.PKey{0xFFFF, 0x8002}, 0x8002, nil)
	if got := a.ifc.bcast.String(); got != "ff12:401b:8001::ffff:ffff" {
		t.Fatalf("broadcast MGID %s, want ff12:401b:8001::ffff:ffff (RFC 4391)", got)
	}
	if a.ifc.pkeyIndex != 1 || b.ifc.pkeyIndex != 2 {
		t.Fatalf("P_Key indices %d, %d; want 1, 2", a.ifc.pkeyIndex, b.ifc.pkeyIndex)
	}
	ping(t, a, b.v4, 8000)
	ping(t, b, a.v4, 8000)
	st := a.ifc.Stats()
	if len(st.TXConns) != 1 || st.TXConns[0].State != txUp.String() || len(st.RXConns) != 1 {
		t.Fatalf("a's connections TX %+v RX %+v; want one of each in 0x8001", st.TXConns, st.RXConns)
	}
	if st.CM.REQs[cm.REQToListener] != 1 || st.CM.REQs[cm.REQBadPKey] != 0 {
		t.Fatalf("a's REQ outcomes %v", st.CM.REQs)
	}
	if err := b.ifc.SetMode(ModeDatagram); err != nil {
		t.Fatal(err)
	}
	ping(t, b, a.v4, 1000)

	unreachable(t, c, a)
	if n := a.ifc.Stats().Counters.RxWrongPKey; n != 0 {
		t.Fatalf("rx_wrong_pkey %d at a before c knew it: c's broadcasts go to ff12:401b:8002::, which a never joined", n)
	}
	knowStatically(t, c, a)
	unreachable(t, c, a)
	if n := a.ifc.Stats().Counters.RxWrongPKey; n == 0 {
		t.Fatal("c's packets to a were not counted as wrong P_Key at a")
	}
	if n := b.ifc.Stats().Counters.RxWrongPKey; n != 0 {
		t.Fatalf("rx_wrong_pkey %d at b, which c never sent to", n)
	}
}

// TestPartitionLimitedMembers: two limited members of partition 1 cannot
// talk (IBTA 10.9.3), their broadcasts reach each other and are counted
// as wrong P_Key; each reaches a full member, in connected mode.
func TestPartitionLimitedMembers(t *testing.T) {
	tn := newTestNet(t, 0, soft.Config{Seed: 32}, nil)
	full := tn.addPartitionNode(0, []hca.PKey{0xFFFF, 0x8001}, 0x8001, nil)
	// Linux keeps an interface's P_Key with the full bit (priv->pkey |=
	// 0x8000); the membership is the table's, whichever the config says.
	l1 := tn.addPartitionNode(1, []hca.PKey{0xFFFF, 0x0001}, 0x0001, nil)
	l2 := tn.addPartitionNode(2, []hca.PKey{0xFFFF, 0x0001}, 0x8001, nil)
	ping(t, l1, full.v4, 8000)
	ping(t, full, l2.v4, 8000)
	before := l2.ifc.Stats().Counters.RxWrongPKey
	unreachable(t, l1, l2)
	if n := l2.ifc.Stats().Counters.RxWrongPKey; n <= before {
		t.Fatalf("rx_wrong_pkey at l2 %d, was %d: l1's broadcasts were not counted", n, before)
	}
	for _, nd := range []*testNode{l1, l2} {
		for _, tc := range nd.ifc.Stats().TXConns {
			if tc.PeerGID == nd.dev.GID().String() {
				t.Fatalf("connection to itself %+v", tc)
			}
		}
	}
}

// TestPartitionSharedCM: a parent (0xFFFF) and a child (0x8001) on one
// device share its one CM; each reaches only its own partition.
func TestPartitionSharedCM(t *testing.T) {
	tn := newTestNet(t, 0, soft.Config{Seed: 33}, nil)
	var nodes [4]*testNode
	var mgrs []*cm.Manager
	for d := range 2 {
		dev, err := tn.fab.NewDevice(fmt.Sprintf("hca%d", d))
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.SetPKeyTable([]hca.PKey{0xFFFF, 0x8001}); err != nil {
			t.Fatal(err)
		}
		m, err := cm.NewManager(dev, fastCM())
		if err != nil {
			t.Fatal(err)
		}
		mgrs = append(mgrs, m)
		if d == 0 {
			// Before the net's cleanup: interfaces, then their CMs.
			t.Cleanup(func() {
				for _, nd := range nodes {
					if nd != nil {
						nd.ifc.Close()
					}
				}
				for _, m := range mgrs {
					m.Close()
				}
			})
		}
		for c, pkey := range []hca.PKey{0xFFFF, 0x8001} {
			k := 2*c + d // parents 10.0.0.1-2, children 10.0.0.3-4
			nodes[k] = tn.addNodeOn(k, dev, func(_ int, cfg *Config) { cfg.PKey, cfg.CMManager = pkey, m })
		}
	}
	ping(t, nodes[0], nodes[1].v4, 8000)
	ping(t, nodes[2], nodes[3].v4, 8000)
	unreachable(t, nodes[2], nodes[1])
	for k, nd := range nodes {
		peer := nodes[k^1].dev.GID().String()
		st := nd.ifc.Stats()
		if len(st.TXConns) != 1 || len(st.RXConns) != 1 || st.TXConns[0].PeerGID != peer || st.RXConns[0].PeerGID != peer {
			t.Fatalf("%s: TX %+v RX %+v; want one each way with %s, its partition's peer", nd.ifc.Name(), st.TXConns, st.RXConns, peer)
		}
	}
	if n := mgrs[0].Stats().Listeners; n != 4 {
		t.Fatalf("%d service IDs listened on, want 2 per interface", n)
	}
	for _, nd := range nodes {
		nd.ifc.Close()
	}
	for _, m := range mgrs {
		if n := m.Stats().Listeners; n != 0 {
			t.Errorf("%d service IDs still listened on after every interface closed", n)
		}
	}
}

// waitLink waits for nd's link to be up or down; the change follows a
// PKEY_CHANGE through the fabric's event dispatcher and the control loop,
// and the state is what shows it.
func waitLink(t *testing.T, nd *testNode, up bool) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for nd.ifc.LinkUp() != up || nd.host.LinkUp() != up {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: link up %v (host %v), want %v", nd.ifc.Name(), nd.ifc.LinkUp(), nd.host.LinkUp(), up)
		}
	}
}

// TestPKeyAppears: an interface whose partition is not in the port's
// table is created with its link down and comes up when the subnet
// manager adds the P_Key (Linux's ipoib_pkey_dev_check_presence and
// PKEY_CHANGE); removed, the link goes down and the peer's packets are
// counted as wrong P_Key; back at its index, the link comes back; moved
// to another index, it stays down. An invalid P_Key is refused at New.
func TestPKeyAppears(t *testing.T) {
	tn := newTestNet(t, 0, soft.Config{Seed: 34}, nil)
	a := tn.addPartitionNode(0, []hca.PKey{0xFFFF, 0x8001}, 0x8001, nil)
	b := tn.addPartitionNode(1, []hca.PKey{0xFFFF}, 0x8001, nil)
	if b.ifc.LinkUp() || b.host.LinkUp() {
		t.Fatal("link up without the P_Key in the table")
	}
	unreachable(t, a, b)
	set := func(table ...hca.PKey) {
		t.Helper()
		if err := b.dev.SetPKeyTable(table); err != nil {
			t.Fatal(err)
		}
	}
	set(0xFFFF, 0x8001)
	waitLink(t, b, true)
	ping(t, a, b.v4, 8000)
	ping(t, b, a.v4, 8000)

	set(0xFFFF, 0x8002)
	waitLink(t, b, false)
	before := b.ifc.Stats().Counters.RxWrongPKey
	unreachable(t, a, b)
	if n := b.ifc.Stats().Counters.RxWrongPKey; n <= before {
		t.Fatalf("rx_wrong_pkey at b %d, was %d: a's packets to the departed partition were not counted", n, before)
	}
	set(0xFFFF, 0x8001)
	waitLink(t, b, true)
	ping(t, a, b.v4, 8000)

	set(0xFFFF, 0x8002, 0x8001)
	waitLink(t, b, false)

	fab := rvFabric(t, 35)
	dev, err := fab.NewDevice("h")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Device: dev, Host: newMemPort(1, nil), PKey: 0x8000}); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Errorf("P_Key 0x8000: %v, want ErrInvalidArgument", err)
	}
}
