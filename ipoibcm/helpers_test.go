package ipoibcm

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// testNode is one host on the soft fabric: a gVisor stack behind an
// Interface.
type testNode struct {
	dev  *soft.Device
	host *netstack.Host
	ifc  *Interface
	v4   netip.Addr
	v6   netip.Addr
	// startedAt is when Start was called: the moment the node is back.
	startedAt time.Time
	// events are the Interface's lifecycle events, for tests to watch.
	events *eventTap

	nextPort uint16
}

type testNet struct {
	t     testing.TB
	fab   *soft.Fabric
	nodes []*testNode
}

// fastCM keeps CM retries in the milliseconds.
func fastCM() cm.Options {
	return cm.Options{ResponseTimeout: 50 * time.Millisecond, MaxRetries: 3, TimeWait: 20 * time.Millisecond, Seed: 1}
}

func nodeAddrs(k int) (netip.Addr, netip.Addr) {
	return netip.AddrFrom4([4]byte{10, 0, 0, byte(k + 1)}), netip.MustParseAddr(fmt.Sprintf("fd00::%d", k+1))
}

// newTestNet builds n nodes; tweak adjusts each node's Config.
func newTestNet(t testing.TB, n int, fcfg soft.Config, tweak func(k int, c *Config)) *testNet {
	t.Helper()
	goroutines := runtime.NumGoroutine()
	fab := soft.NewFabric(fcfg)
	tn := &testNet{t: t, fab: fab}
	t.Cleanup(func() {
		for _, nd := range tn.nodes {
			if nd.ifc != nil {
				nd.ifc.Close()
			}
		}
		fab.Close()
		checkGoroutines(t, goroutines)
	})
	for k := range n {
		tn.addNode(k, tweak)
	}
	return tn
}

func (tn *testNet) addNode(k int, tweak func(k int, c *Config)) *testNode {
	t := tn.t
	t.Helper()
	dev, err := tn.fab.NewDevice(fmt.Sprintf("hca%d", k))
	if err != nil {
		t.Fatal(err)
	}
	return tn.addNodeOn(k, dev, tweak)
}

func (tn *testNet) addNodeOn(k int, dev *soft.Device, tweak func(k int, c *Config)) *testNode {
	t := tn.t
	t.Helper()
	v4, v6 := nodeAddrs(k)
	events := &eventTap{}
	var host *netstack.Host
	ifc := testInterface(t, dev, nil, fmt.Sprintf("ib%d", k), func(cfg *Config) {
		cfg.CMBackoff = time.Second
		if tweak != nil {
			tweak(k, cfg)
		}
		cfg.Events = Observers(cfg.Events, events)
		mtu := cfg.MTU
		if mtu == 0 {
			mtu = 65520
			if cfg.Mode == ModeDatagram {
				mtu = int(dev.Port().ActiveMTU) - 4
			}
		}
		var err error
		host, err = netstack.New(netstack.Config{
			Addrs: []netip.Prefix{netip.PrefixFrom(v4, 24), netip.PrefixFrom(v6, 64)},
			MTU:   mtu,
		})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Host = host
	})
	startedAt := time.Now()
	startTest(t, ifc)
	nd := &testNode{dev: dev, host: host, ifc: ifc, v4: v4, v6: v6, startedAt: startedAt, events: events}
	if k < len(tn.nodes) {
		tn.nodes[k] = nd
	} else {
		tn.nodes = append(tn.nodes, nd)
	}
	return nd
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ping pings until one echo comes back (the first may be lost to
// address resolution) or the context ends.
func ping(t *testing.T, from *testNode, to netip.Addr, size int) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	var err error
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		_, err = from.host.Ping(pctx, to, size)
		cancel()
		if err == nil {
			return
		}
	}
	t.Fatalf("ping %s from %s (%d bytes): %v", to, from.v4, size, err)
}

// checkGoroutines waits (event-free polling of a counter is the only way
// to observe goroutine exit) for the count to return to the baseline.
func checkGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Errorf("goroutines: %d > %d at start\n%s", runtime.NumGoroutine(), base, buf[:n])
			return
		}
		time.Sleep(time.Millisecond) // polling goroutine exit; nothing to synchronise on
	}
}

var _ hca.Device = (*soft.Device)(nil)

// hcaUDConfig is a throwaway UD QP config (to shift QPN allocation).
func hcaUDConfig(t *testing.T, dev hca.Device) hca.QPConfig {
	cq, err := dev.CreateCQ(hca.CQConfig{Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	return hca.QPConfig{Type: hca.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1}
}

func hcaErrorAttr() hca.QPAttr { return hca.QPAttr{State: hca.QPStateError} }

// eventTap is an EventObserver whose watchers a test adds at any time:
// each runs, on the engine's goroutine that emitted it, for every event
// of its kind from then on.
type eventTap struct {
	mu       sync.Mutex
	watchers map[EventKind][]func(Event)
}

func (e *eventTap) ObserveEvent(ev Event) {
	e.mu.Lock()
	ws := e.watchers[ev.Kind]
	e.mu.Unlock()
	for _, w := range ws {
		w(ev)
	}
}

// on adds a watcher of kind.
func (e *eventTap) on(kind EventKind, w func(Event)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.watchers == nil {
		e.watchers = make(map[EventKind][]func(Event))
	}
	e.watchers[kind] = append(e.watchers[kind], w)
}

// testInterface is how this package's tests make an Interface: New on dev
// with host, from the tests' defaults (connected mode, fast CM retries, a
// 2 s DrainTimeout) that tweak adjusts. Close runs at cleanup (before
// that of a fabric made earlier). startTest starts it; testNet,
// raceStart and rvStart are this pair on their kind of device and host.
func testInterface(t testing.TB, dev hca.Device, host HostPort, name string, tweak func(*Config)) *Interface {
	t.Helper()
	cfg := Config{Device: dev, Host: host, Name: name, Mode: ModeConnected, CM: fastCM(), DrainTimeout: 2 * time.Second}
	if tweak != nil {
		tweak(&cfg)
	}
	ifc, err := New(cfg)
	if err != nil {
		if cfg.Host != nil {
			cfg.Host.Close()
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { ifc.Close() })
	return ifc
}

// startTest starts ifc, failing the test if it cannot.
func startTest(t testing.TB, ifc *Interface) {
	t.Helper()
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
}
