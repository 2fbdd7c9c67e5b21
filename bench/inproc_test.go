package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

func TestInProcTCPDirect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 16 << 20
	for _, mtu := range []int{1500, 65520} {
		res, err := InProcTCP(ctx, n, mtu, DirectLink)
		if err != nil {
			t.Fatalf("MTU %d: %v", mtu, err)
		}
		if res.Bytes != n || res.Elapsed <= 0 || res.Gbps <= 0 {
			t.Fatalf("MTU %d: %+v", mtu, res)
		}
		want := float64(n) * 8 / res.Elapsed.Seconds() / 1e9
		if d := res.Gbps - want; d > 1e-9 || d < -1e-9 {
			t.Fatalf("Gbps %v, want %v from bytes and elapsed", res.Gbps, want)
		}
		t.Logf("direct MTU %d: %v", mtu, res)
	}
}

// TestInProcTCPDirectGSO: the direct-gso row's link moves the stream in
// super frames far above the MTU, and every byte arrives.
func TestInProcTCPDirectGSO(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 16 << 20
	var ca netstack.Counters
	link := func(a, b *netstack.Host) (func(), error) {
		stop, err := DirectLinkOffloads(a, b)
		return func() { stop(); ca = a.Counters() }, err
	}
	res, err := RunInProcTCP(ctx, InProcConfig{Bytes: n, MTU: 4092, Link: link, Host: netstack.Config{GSO: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != n || res.Gbps <= 0 {
		t.Fatalf("%+v", res)
	}
	// A 64 KiB super frame is 16 segments at MTU 4092; most of the
	// stream must have crossed in them.
	if ca.TxSuperFrames < n/(64<<10)/2 || ca.TxBytes/ca.TxPackets < 16<<10 {
		t.Fatalf("A handed out %d super frames in %d frames of %d bytes: GSO not in use", ca.TxSuperFrames, ca.TxPackets, ca.TxBytes)
	}
	t.Logf("direct-gso MTU 4092: %v; %d super frames of %d frames", res, ca.TxSuperFrames, ca.TxPackets)
}

func TestRunInProcTCPTuned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := RunInProcTCP(ctx, InProcConfig{
		Bytes: 4 << 20, MTU: 9000, Link: DirectLink, WriteSize: 64 << 10,
		Host: netstack.Config{GSO: true, TrustRXChecksums: true, QueueLen: 1024,
			TCP: netstack.TCPOptions{CongestionControl: "reno", BufferMax: 16 << 20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != 4<<20 || res.Gbps <= 0 {
		t.Fatalf("%+v", res)
	}
	_, err = RunInProcTCP(ctx, InProcConfig{Bytes: 1, MTU: 100, Link: DirectLink})
	if err == nil {
		t.Fatal("MTU 100 accepted")
	}
}

func TestInProcTCPLinkFailure(t *testing.T) {
	broken := errors.New("no fabric")
	_, err := InProcTCP(context.Background(), 1, 1500, func(a, b *netstack.Host) (func(), error) {
		return nil, broken
	})
	if !errors.Is(err, broken) {
		t.Fatalf("err = %v, want the factory's error", err)
	}
	if _, err := InProcTCP(context.Background(), 0, 1500, DirectLink); err == nil {
		t.Fatal("zero bytes accepted")
	}
	if _, err := InProcTCP(context.Background(), 1, 1500, nil); err == nil {
		t.Fatal("nil link accepted")
	}
}

// TestInProcTCPNoLinkTimesOut joins nothing: the dial cannot complete and
// the run must end with the context, leaving no goroutine behind.
func TestInProcTCPNoLinkTimesOut(t *testing.T) {
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := InProcTCP(ctx, 1<<20, 1500, func(a, b *netstack.Host) (func(), error) {
			cancel() // nothing will ever answer; give up at once
			return func() { close(stopped) }, nil
		})
		res <- err
	}()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	<-stopped
	testutil.WaitGoroutines(t, base)
}

func TestResultString(t *testing.T) {
	r := Result{Bytes: 1 << 20, Elapsed: time.Millisecond, Gbps: gbps(1<<20, time.Millisecond)}
	if got, want := r.String(), fmt.Sprintf("1048576 bytes in 1ms: %.2f Gbit/s", 8.388608); got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}

// BenchmarkDirectLink is the in-memory baseline ib0 is measured against:
// TCP between two netstack hosts joined by DirectLink. Each iteration is a
// fresh pair of hosts and one 32 MiB transfer; Gbit/s counts only the
// transfer.
func BenchmarkDirectLink(b *testing.B) {
	benchmarkLink(b, DirectLink, netstack.Config{})
}

// BenchmarkDirectLinkOffloads is BenchmarkDirectLink with host GSO and
// the offload metadata carried across (the direct-gso row).
func BenchmarkDirectLinkOffloads(b *testing.B) {
	benchmarkLink(b, DirectLinkOffloads, netstack.Config{GSO: true})
}

// benchmarkLink runs the MTU sweep over link with host as the template for
// both hosts; an ib0 benchmark calls it with its own factory.
func benchmarkLink(b *testing.B, link LinkFactory, host netstack.Config) {
	const chunk = 32 << 20
	for _, mtu := range []int{1500, 9000, 65520} {
		b.Run(fmt.Sprintf("mtu%d", mtu), func(b *testing.B) {
			b.SetBytes(chunk)
			b.ReportAllocs()
			var total Result
			for b.Loop() {
				res, err := RunInProcTCP(b.Context(), InProcConfig{Bytes: chunk, MTU: mtu, Link: link, Host: host})
				if err != nil {
					b.Fatal(err)
				}
				total.Bytes += res.Bytes
				total.Elapsed += res.Elapsed
			}
			b.ReportMetric(gbps(total.Bytes, total.Elapsed), "Gbit/s")
		})
	}
}
