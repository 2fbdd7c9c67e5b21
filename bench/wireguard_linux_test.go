package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/tap"
)

// TestWireGuardGoScenario runs the suite's wireguard-go scenario alone
// for a second in fresh namespaces: iperf3 moves bytes, the devices'
// peer counters saw at least those bytes each way they went, and
// afterwards no namespace and no goroutine of the devices is left.
func TestWireGuardGoScenario(t *testing.T) {
	requireIperfRoot(t)
	goroutines := runtime.NumGoroutine()
	var progress bytes.Buffer
	cfg := RoCEv2SuiteConfig{Progress: &progress}
	cfg.defaults()
	base := IperfSuiteConfig{Duration: time.Second, Owner: &tap.Owner{MarkerDir: t.TempDir()},
		NetnsA: fmt.Sprintf("ipoibt-%d-wa", os.Getpid()), NetnsB: fmt.Sprintf("ipoibt-%d-wb", os.Getpid())}
	base.defaults()
	var sent, received int64
	var stopErr error
	build := func(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
		l, err := cfg.openWireGuard(mtu, a, b, addrA, addrB)
		if err != nil {
			return nil, err
		}
		return func() error {
			var serr, rerr error
			sent, _, serr = l.transfer(0)
			_, received, rerr = l.transfer(1)
			stopErr = errors.Join(serr, rerr)
			return l.Close()
		}, nil
	}
	res, err := runScenario(context.Background(), base, build, "connected", cfg.runMTU(ScenarioWireGuardGo, 65520))
	if err != nil {
		t.Fatalf("wireguard-go scenario: %v; device log: %s", err, progress.String())
	}
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	t.Logf("wireguard-go at mtu %d: %.2f Gbit/s, %d bytes, %d retransmits, mss %d; a sent %d, b received %d",
		cfg.wireGuardMTU(), res.Gbps, res.Bytes, res.Retransmits, res.MSS, sent, received)
	if res.Gbps <= 0 || res.Bytes <= 0 {
		t.Errorf("iperf3 over wireguard-go: %+v, want a positive rate and bytes", res)
	}
	// MSS follows wg0's MTU: 8920 - 40 (IP+TCP) - 12 (timestamps).
	if res.MSS <= 0 || res.MSS > cfg.wireGuardMTU()-40 {
		t.Errorf("mss %d does not reflect wg0's mtu %d", res.MSS, cfg.wireGuardMTU())
	}
	if sent < res.Bytes || received < res.Bytes {
		t.Errorf("peer counters: a sent %d, b received %d bytes; iperf3 moved %d", sent, received, res.Bytes)
	}
	for _, name := range []string{base.NetnsA, base.NetnsB} {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind", name)
		}
	}
	testutil.WaitGoroutines(t, goroutines)
	if progress.Len() > 0 {
		t.Errorf("wireguard-go logged errors:\n%s", progress.String())
	}
}
