package cli

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// TestUpPKeyPartitions: 'ipoib up --pkey' puts each ib0 into a partition
// (its RoCEv2 port's table {0xffff, --pkey}), with head-end replication
// so every broadcast reaches every port. Two full members of 0x8001 talk,
// a limited member (0x0001) talks to a full one but not to another
// limited one; a host in 0x8002 on the same IP subnet reaches none, and
// the ports it sent to count its packets as wrong P_Key.
func TestUpPKeyPartitions(t *testing.T) {
	bind := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 77, 13, byte(i)}) }
	port := borrowPort(t, bind(1))
	pkeys := []hca.PKey{0x8001, 0x8001, 0x8002, 0x0001, 0x0001}
	var nodes []*upNode
	for i, k := range pkeys {
		var peers []netip.Addr
		for j := range pkeys {
			if j != i {
				peers = append(peers, bind(j+1))
			}
		}
		o := upDefaults(netip.AddrPortFrom(bind(i+1), port), peers)
		o.PKey = k
		o.Multicast = false
		nodes = append(nodes, startUpNode(t, o, netip.AddrFrom4([4]byte{10, 77, 13, byte(i + 1)})))
	}
	for i, n := range nodes {
		want := "full"
		if pkeys[i]&0x8000 == 0 {
			want = "limited"
		}
		if got := n.ifc.PKey(); got != pkeys[i]|0x8000 || n.ifc.Membership() != want {
			t.Fatalf("node %d: P_Key %#x membership %s", i, got, n.ifc.Membership())
		}
		if tbl := n.dev.Port().PKeys; len(tbl) != 2 || tbl[0] != hca.PKeyDefault || tbl[1] != pkeys[i] {
			t.Fatalf("node %d: P_Key table %#x", i, tbl)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, pair := range [][2]int{{0, 1}, {3, 0}, {1, 4}} {
		if err := nodes[pair[0]].ping(ctx, nodes[pair[1]].ip); err != nil {
			t.Fatalf("node %d (0x%04x) -> node %d (0x%04x): %v", pair[0], uint16(pkeys[pair[0]]), pair[1], uint16(pkeys[pair[1]]), err)
		}
	}
	before := nodes[0].ifc.Stats().Counters.RxWrongPKey
	for _, pair := range [][2]int{{2, 0}, {0, 2}, {3, 4}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := nodes[pair[0]].ping(ctx, nodes[pair[1]].ip)
		cancel()
		if err == nil {
			t.Errorf("node %d (0x%04x) reached node %d (0x%04x)", pair[0], uint16(pkeys[pair[0]]), pair[1], uint16(pkeys[pair[1]]))
		}
	}
	if after := nodes[0].ifc.Stats().Counters.RxWrongPKey; after <= before {
		t.Errorf("node 0 counted %d wrong-P_Key packets while node 2 (0x8002) tried it, before %d", after, before)
	}
	if n := nodes[3].ifc.Stats().Counters.RxWrongPKey; n == 0 {
		t.Error("node 3 (limited) counted no wrong-P_Key packets from node 4 (limited)")
	}
}
