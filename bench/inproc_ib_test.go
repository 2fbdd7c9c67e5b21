package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// TestInProcIB moves a transfer over ib0 in each mode and checks, from the
// engines' own counters, that it went the way the mode says: over an RC
// connection in connected mode, over UD (no connection initiated) in
// datagram mode, nothing dropped on the way, and every goroutine gone after.
func TestInProcIB(t *testing.T) {
	for _, c := range []struct {
		mode ipoibcm.Mode
		mtu  int
	}{{ipoibcm.ModeConnected, 65520}, {ipoibcm.ModeDatagram, 4092}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			base := runtime.NumGoroutine()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 8 << 20
			var sa, sb ipoibcm.Stats
			stopped := 0
			var hb *netstack.Host
			ib := IBLink(IBLinkConfig{Mode: c.mode, Seed: 3, OnStop: func(a, b ipoibcm.Stats) {
				sa, sb = a, b
				stopped++
			}})
			link := func(a, b *netstack.Host) (func(), error) {
				hb = b
				return ib(a, b)
			}
			res, err := RunInProcTCP(ctx, InProcConfig{Bytes: n, MTU: c.mtu, Link: link})
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes != n || res.Gbps <= 0 {
				t.Fatalf("%+v", res)
			}
			if stopped != 1 {
				t.Fatalf("OnStop called %d times", stopped)
			}
			if sa.Mode != c.mode.String() || sa.MTU != c.mtu || sb.MTU != c.mtu {
				t.Fatalf("interfaces %s/%d and %d, want %s/%d", sa.Mode, sa.MTU, sb.MTU, c.mode, c.mtu)
			}
			if sb.Counters.RxBytes < n {
				t.Fatalf("B received %d IPoIB bytes, less than the %d-byte payload", sb.Counters.RxBytes, n)
			}
			var connBytes uint64
			for _, tc := range sa.TXConns {
				connBytes += tc.Bytes
			}
			switch c.mode {
			case ipoibcm.ModeConnected:
				if connBytes < n {
					t.Fatalf("A sent %d bytes over RC, want at least %d: %+v", connBytes, n, sa.TXConns)
				}
			case ipoibcm.ModeDatagram:
				if len(sa.TXConns) != 0 || sa.Reaper.TXConnects != 0 {
					t.Fatalf("datagram mode initiated connections: %+v", sa.TXConns)
				}
				// B's engine merged A's packets (the hosts' GSO is off
				// here: MTU-sized segments) and handed the super frames
				// over in pieces, and B's host took their partial
				// checksums as they were.
				hc := hb.Counters()
				if sb.Offloads.RxGROFrames == 0 || hc.RxGathered != sb.Offloads.RxGROFrames || hc.RxCsumVouched < hc.RxGathered {
					t.Fatalf("offloads unused: B %d GRO frames, B's host %d gathered, %d checksums vouched",
						sb.Offloads.RxGROFrames, hc.RxGathered, hc.RxCsumVouched)
				}
			}
			if d := sa.Counters.TxDropped + sb.Counters.RxDropped; d != 0 {
				t.Fatalf("%d dropped: A %v, B %v", d, sa.Drops, sb.Drops)
			}
			testutil.WaitGoroutines(t, base)
		})
	}
}

// TestIBLinkDatagramCapsMTU gives datagram mode hosts with a 65520-byte
// MTU: the engine caps the link at the UD MTU and lowers both hosts, and
// TCP still works.
func TestIBLinkDatagramCapsMTU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mtuA int
	link := IBLink(IBLinkConfig{Mode: ipoibcm.ModeDatagram, OnStop: func(a, _ ipoibcm.Stats) { mtuA = a.MTU }})
	if _, err := RunInProcTCP(ctx, InProcConfig{Bytes: 1 << 20, MTU: 65520, Link: link}); err != nil {
		t.Fatal(err)
	}
	if mtuA != 4092 {
		t.Fatalf("datagram MTU %d, want 4092", mtuA)
	}
}

// TestIBLinkStartFailure: an invalid engine setting fails the factory with
// the engine's error, and whatever was started (the first interface, the
// fabric) is stopped.
func TestIBLinkStartFailure(t *testing.T) {
	base := runtime.NumGoroutine()
	link := IBLink(IBLinkConfig{Mode: ipoibcm.ModeConnected, Tweak: func(c *ipoibcm.Config) {
		if c.Name == "ib1" {
			c.SendQueueSize = 2 // below the engine's minimum of 4
		}
	}})
	_, err := InProcTCP(context.Background(), 1, 1500, link)
	if err == nil {
		t.Fatal("link with an invalid queue size started")
	}
	t.Logf("error: %v", err)
	testutil.WaitGoroutines(t, base)
}

// TestIBLinkStopTwice: stop reports the statistics once, closes the hosts
// (the interfaces own them) and may be called again.
func TestIBLinkStopTwice(t *testing.T) {
	base := runtime.NumGoroutine()
	a, err := netstack.New(netstack.Config{MTU: 65520, Addrs: []netip.Prefix{InProcAddrA}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := netstack.New(netstack.Config{MTU: 65520, Addrs: []netip.Prefix{InProcAddrB}})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	stop, err := IBLink(IBLinkConfig{Mode: ipoibcm.ModeConnected, OnStop: func(sa, sb ipoibcm.Stats) {
		calls++
		if !sa.LinkUp || !sb.LinkUp || sa.Name != "ib0" || sb.Name != "ib1" {
			t.Errorf("stats at stop: %s up=%t, %s up=%t", sa.Name, sa.LinkUp, sb.Name, sb.LinkUp)
		}
	}})(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if !a.LinkUp() || !b.LinkUp() {
		t.Fatal("hosts have no carrier after the link started")
	}
	stop()
	stop()
	if calls != 1 {
		t.Fatalf("OnStop called %d times, want 1", calls)
	}
	if _, err := a.ReadFrames(make([][]byte, 1), make([]int, 1)); err == nil {
		t.Fatal("host A still open after stop")
	}
	testutil.WaitGoroutines(t, base)
}

// BenchmarkInProcIB is TCP between two netstack hosts over ib0: connected
// mode at MTU 65520 and datagram mode at the UD MTU, with the host settings
// of the 'ipoib bench' table (InProcHostConfig), the same as
// BenchmarkDirectLink's, so the ratios compare links, and the soft fabric
// receiving newest-first as in the table.
func BenchmarkInProcIB(b *testing.B) {
	for _, c := range []struct {
		mode ipoibcm.Mode
		mtu  int
	}{{ipoibcm.ModeConnected, 65520}, {ipoibcm.ModeDatagram, 4092}} {
		b.Run(c.mode.String(), func(b *testing.B) {
			streamTCP(b, InProcConfig{MTU: c.mtu, Link: IBLink(IBLinkConfig{Mode: c.mode, Seed: 1, ReceiveOrder: soft.ReceiveNewestFirst}), Host: InProcHostConfig()})
		})
	}
}

// streamTCP builds the two hosts and the link once, warms the connection
// path up, and then streams b.N chunks of 32 MiB over one TCP connection:
// what is timed and profiled is the stacks and the link, not their setup.
// The receiver counts every byte.
func streamTCP(b *testing.B, cfg InProcConfig) {
	const chunk = 32 << 20
	ctx := b.Context()
	ca, cb := cfg.Host, cfg.Host
	ca.MTU, cb.MTU = cfg.MTU, cfg.MTU
	ca.Addrs = []netip.Prefix{InProcAddrA}
	cb.Addrs = []netip.Prefix{InProcAddrB}
	ha, err := netstack.New(ca)
	if err != nil {
		b.Fatal(err)
	}
	defer ha.Close()
	hb, err := netstack.New(cb)
	if err != nil {
		b.Fatal(err)
	}
	defer hb.Close()
	stop, err := cfg.Link(ha, hb)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	// Resolve neighbours and bring the connection up outside the timer.
	if _, err := measureTCP(ctx, ha, hb, 1<<20, 256<<10); err != nil {
		b.Fatal(err)
	}
	ln, err := hb.ListenTCP(inprocPort + 1)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- -1
			return
		}
		n, _ := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
		c.Close()
		done <- n
	}()
	c, err := ha.DialTCP(ctx, netip.AddrPortFrom(InProcAddrB.Addr(), inprocPort+1))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 256<<10)
	b.SetBytes(chunk)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		for sent := 0; sent < chunk; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	c.Close()
	n := <-done
	elapsed := time.Since(start)
	b.StopTimer()
	if want := int64(b.N) * chunk; n != want {
		b.Fatalf("received %d of %d bytes", n, want)
	}
	b.ReportMetric(gbps(n, elapsed), "Gbit/s")
}

// BenchmarkInProcDirect is the baseline of BenchmarkInProcIB in the same
// shape: the direct link at each mode's MTU.
func BenchmarkInProcDirect(b *testing.B) {
	for _, mtu := range []int{65520, 4092} {
		b.Run(fmt.Sprintf("mtu%d", mtu), func(b *testing.B) {
			streamTCP(b, InProcConfig{MTU: mtu, Link: DirectLink, Host: InProcHostConfig()})
		})
	}
}

// BenchmarkInProcDirectGSO is BenchmarkInProcDirect over the direct link
// with host GSO and the offload metadata carried across (the direct-gso
// row): the baseline of the datagram row's target (docs/performance.md).
func BenchmarkInProcDirectGSO(b *testing.B) {
	for _, mtu := range []int{65520, 4092} {
		b.Run(fmt.Sprintf("mtu%d", mtu), func(b *testing.B) {
			streamTCP(b, InProcConfig{MTU: mtu, Link: DirectLinkOffloads, Host: InProcHostConfig()})
		})
	}
}
