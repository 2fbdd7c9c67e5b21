package ipoibcm

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// addChild gives node k a child in partition pkey, with a gVisor host at
// 10.0.<subnet>.k+1.
func addChild(t *testing.T, parent *testNode, k int, pkey hca.PKey, subnet byte) *testNode {
	t.Helper()
	// The test is the subnet manager: the port joins the partition.
	if tbl := parent.dev.Port().PKeys; !slices.Contains(tbl, pkey) {
		if err := parent.dev.SetPKeyTable(append(tbl, pkey)); err != nil {
			t.Fatal(err)
		}
	}
	v4 := netip.AddrFrom4([4]byte{10, 0, subnet, byte(k + 1)})
	host, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(v4, 24)}, MTU: 65520})
	if err != nil {
		t.Fatal(err)
	}
	c, err := parent.ifc.NewChild(Config{
		Host: host, Name: fmt.Sprintf("ib%d.%04x", k, uint16(pkey)), Mode: ModeConnected, PKey: pkey,
		CMBackoff: time.Second, DrainTimeout: 2 * time.Second,
	})
	if err != nil {
		host.Close()
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	return &testNode{dev: parent.dev, host: host, ifc: c, v4: v4}
}

// A child has its own UD QP, hardware address, listener and connections
// on its parent's device and CM; parent and child carry traffic at the
// same time, each counted on its own interface.
func TestChildBesideParent(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 41}, nil)
	a, b := tn.nodes[0], tn.nodes[1]
	ca := addChild(t, a, 0, 0x8001, 1)
	cb := addChild(t, b, 1, 0x8001, 1)
	if ca.ifc.HWAddr().QPN() == a.ifc.HWAddr().QPN() {
		t.Fatalf("child shares the parent's UD QPN %#x", ca.ifc.HWAddr().QPN())
	}
	if got := ca.ifc.PKey(); got != 0x8001 || ca.ifc.Parent() != a.ifc {
		t.Fatalf("child P_Key %#x parent %v", got, ca.ifc.Parent())
	}

	const size = 4 << 20
	t.Run("together", func(t *testing.T) {
		t.Run("parent", func(t *testing.T) { t.Parallel(); tcpTransfer(t, a, b, b.v4, size, nil) })
		t.Run("child", func(t *testing.T) { t.Parallel(); tcpTransfer(t, ca, cb, cb.v4, size, nil) })
	})
	for _, nd := range []*testNode{a, ca} {
		st := nd.ifc.Stats()
		if st.Counters.TxBytes < size || len(st.TXConns) != 1 {
			t.Fatalf("%s: tx %d bytes, %d TX conns; want >= %d and 1", st.Name, st.Counters.TxBytes, len(st.TXConns), size)
		}
		if st.TXConns[0].Bytes < size {
			t.Fatalf("%s: its connection carried %d bytes", st.Name, st.TXConns[0].Bytes)
		}
	}
	// The neighbours are apart: the parent knows b's parent only.
	if n := a.ifc.Stats().Neighbours; len(n) != 1 || n[0].HWAddr != b.ifc.HWAddr().ColonString() {
		t.Fatalf("parent neighbours %+v, want b's ib0 %s only", n, b.ifc.HWAddr().ColonString())
	}
}

// Deleting a child leaves the parent running and nothing of the child
// behind: its goroutines end, its P_Key is free again.
func TestChildCloseLeavesParent(t *testing.T) {
	tn := newTestNet(t, 2, soft.Config{Seed: 42}, nil)
	a, b := tn.nodes[0], tn.nodes[1]
	ping(t, a, b.v4, 100)
	base := runtime.NumGoroutine()
	ca := addChild(t, a, 0, 0x8002, 2)
	cb := addChild(t, b, 1, 0x8002, 2)
	ping(t, ca, cb.v4, 1000)
	if err := ca.ifc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cb.ifc.Close(); err != nil {
		t.Fatal(err)
	}
	checkGoroutines(t, base)
	if n := len(a.ifc.Children()); n != 0 {
		t.Fatalf("parent has %d children after close", n)
	}
	ping(t, a, b.v4, 2000)
	// The partition can be taken again.
	again := addChild(t, a, 0, 0x8002, 2)
	if again.ifc.PKey() != 0x8002 {
		t.Fatalf("P_Key %#x", again.ifc.PKey())
	}
}

func TestNewChildRefuses(t *testing.T) {
	tn := newTestNet(t, 1, soft.Config{Seed: 43}, nil)
	a := tn.nodes[0]
	c := addChild(t, a, 0, 0x8001, 1)
	host := func() HostPort {
		h, err := netstack.New(netstack.Config{MTU: 65520})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	other, err := tn.fab.NewDevice("other")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		parent *Interface
		cfg    Config
		want   error
	}{
		{"same partition", a.ifc, Config{PKey: 0x8001}, ErrPKeyInUse},
		{"same partition, limited spelling", a.ifc, Config{PKey: 0x0001}, ErrPKeyInUse},
		{"parent's partition", a.ifc, Config{PKey: 0xFFFF}, ErrPKeyInUse},
		{"P_Key 0", a.ifc, Config{PKey: 0}, ErrInvalidPKey},
		{"P_Key 0x8000", a.ifc, Config{PKey: 0x8000}, ErrInvalidPKey},
		{"nested", c.ifc, Config{PKey: 0x8003}, ErrNotParent},
		{"other device", a.ifc, Config{PKey: 0x8003, Device: other}, hca.ErrInvalidArgument},
	} {
		tc.cfg.Host = host()
		tc.cfg.Name = "x"
		if _, err := tc.parent.NewChild(tc.cfg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := len(a.ifc.Children()); n != 1 {
		t.Fatalf("%d children after refusals, want 1", n)
	}
	// Closing the parent closes the child.
	if err := a.ifc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ifc.Stats(), c.ifc.SetMode(ModeDatagram); !errors.Is(err, ErrNotStarted) && !errors.Is(err, ErrClosed) {
		t.Fatalf("child after the parent's close: SetMode %v", err)
	}
	if _, err := a.ifc.NewChild(Config{PKey: 0x8004, Host: host(), Name: "y"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("child of a closed parent: %v", err)
	}
}
