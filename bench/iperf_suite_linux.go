package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/tap"
)

// IBLinkFactory brings up ib0 in namespaces a and b (a TAP each, joined by
// IPoIB interfaces in the given mode on one soft fabric) with the given
// addresses and MTU, and returns a function that tears it all down. The
// CLI provides it, so bench stays free of the engine's wiring.
type IBLinkFactory func(ctx context.Context, mode string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (stop func() error, err error)

// IperfSuiteConfig configures RunIperfSuite.
type IperfSuiteConfig struct {
	// Modes are the ib0 modes to measure ("connected", "datagram").
	Modes []string
	// MTU gives each mode's IP MTU; the baselines of that mode use it too.
	MTU map[string]int
	// Duration and Streams of each iperf3 test.
	Duration time.Duration
	Streams  int
	// IB builds the ib0 link; nil skips the ib0 runs (recorded as errors).
	IB IBLinkFactory
	// IBOffloads says the TAPs IB opens carry offloads (a virtio header:
	// TSO, checksum offload, GRO); the ib0 rows' offloads column shows it.
	IBOffloads bool
	// Owner creates and cleans up the bench namespaces.
	Owner *tap.Owner
	// Progress receives one line per step; nil discards.
	Progress io.Writer
	// NetnsA/NetnsB name the client and server namespaces; defaults
	// ipoib-bench-a and ipoib-bench-b.
	NetnsA, NetnsB string
	// AddrA/AddrB default to 10.78.0.1/24 and 10.78.0.2/24.
	AddrA, AddrB netip.Prefix
}

func (c *IperfSuiteConfig) defaults() {
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.NetnsA == "" {
		c.NetnsA = "ipoib-bench-a"
	}
	if c.NetnsB == "" {
		c.NetnsB = "ipoib-bench-b"
	}
	if !c.AddrA.IsValid() {
		c.AddrA = netip.MustParsePrefix("10.78.0.1/24")
	}
	if !c.AddrB.IsValid() {
		c.AddrB = netip.MustParsePrefix("10.78.0.2/24")
	}
	if c.Owner == nil {
		c.Owner = &tap.Owner{}
	}
	if c.Streams <= 0 {
		c.Streams = 1
	}
	if c.Duration <= 0 {
		c.Duration = 5 * time.Second
	}
}

// linkBuilder sets up one scenario's link between the two namespaces.
type linkBuilder func(ctx context.Context, mode string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error)

// RunIperfSuite measures, for every mode, a veth pair, a tap-pipe and an
// offload tap-pipe at that mode's MTU and then ib0 in that mode, each in a fresh pair of
// namespaces. A failing run is recorded and the suite goes on; the error
// returned is only for failures that stop the whole suite.
func RunIperfSuite(ctx context.Context, cfg IperfSuiteConfig) (*IperfReport, error) {
	cfg.defaults()
	if err := CheckIperfTools(); err != nil {
		return nil, err
	}
	if removed, err := cfg.Owner.CleanupStale(); err != nil {
		return nil, fmt.Errorf("iperf suite: %w", err)
	} else if len(removed) > 0 {
		fmt.Fprintf(cfg.Progress, "removed stale namespaces of a crashed run: %v\n", removed)
	}
	report := &IperfReport{Started: time.Now(), Duration: cfg.Duration, Streams: cfg.Streams}
	type step struct {
		scenario string
		build    linkBuilder
	}
	var ib linkBuilder
	if cfg.IB != nil {
		ib = linkBuilder(cfg.IB)
	}
	steps := []step{{ScenarioVeth, buildVeth}, {ScenarioTapPipe, buildTapPipe}, {ScenarioTapPipeOffload, buildTapPipeOffload}, {ScenarioIB, ib}}
	total := len(steps) * len(cfg.Modes)
	n := 0
	for _, mode := range cfg.Modes {
		mtu := cfg.MTU[mode]
		if mtu <= 0 {
			return nil, fmt.Errorf("iperf suite: no MTU for mode %q", mode)
		}
		for _, s := range steps {
			n++
			if err := ctx.Err(); err != nil {
				return report, fmt.Errorf("iperf suite: %w", err)
			}
			fmt.Fprintf(cfg.Progress, "[%d/%d] %-8s mode %-9s mtu %5d: running %v ...\n", n, total, s.scenario, mode, mtu, cfg.Duration)
			run := IperfRun{Scenario: s.scenario, Mode: mode, MTU: mtu, Offloads: scenarioOffloads(s.scenario) || s.scenario == ScenarioIB && cfg.IBOffloads}
			if s.build == nil {
				run.Err = "no ib0 link factory configured"
			} else if res, err := runScenario(ctx, cfg, s.build, mode, mtu); err != nil {
				run.Err = err.Error()
			} else {
				run.Result = &res
			}
			if run.Result != nil {
				fmt.Fprintf(cfg.Progress, "[%d/%d] %-8s mode %-9s mtu %5d: %.2f Gbit/s, %d retransmits\n", n, total, s.scenario, mode, mtu, run.Result.Gbps, run.Result.Retransmits)
			} else {
				fmt.Fprintf(cfg.Progress, "[%d/%d] %-8s mode %-9s mtu %5d: FAILED: %s\n", n, total, s.scenario, mode, mtu, run.Err)
			}
			report.Runs = append(report.Runs, run)
		}
	}
	report.Compare()
	return report, nil
}

// runScenario creates the namespaces, builds the link, runs iperf3 from A
// to B and removes everything, whatever happened.
func runScenario(ctx context.Context, cfg IperfSuiteConfig, build linkBuilder, mode string, mtu int) (res IperfResult, err error) {
	a, err := cfg.Owner.Create(cfg.NetnsA)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, a.Delete()) }()
	b, err := cfg.Owner.Create(cfg.NetnsB)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, b.Delete()) }()
	stop, err := build(ctx, mode, mtu, a, b, cfg.AddrA, cfg.AddrB)
	if err != nil {
		return res, fmt.Errorf("link: %w", err)
	}
	defer func() {
		if serr := stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("link stop: %w", serr))
		}
	}()
	res, _, err = RunIperf3(ctx, IperfSpec{
		ServerNetns: b.Name(), ClientNetns: a.Name(), ServerAddr: cfg.AddrB.Addr(),
		Duration: cfg.Duration, Streams: cfg.Streams,
	})
	return res, err
}

func buildVeth(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	err := tap.CreateVethPair(a, "veth-a", tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addrA}, Up: true},
		b, "veth-b", tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addrB}, Up: true})
	if err != nil {
		return nil, err
	}
	// The pair goes with the namespaces.
	return func() error { return nil }, nil
}

func buildTapPipe(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	da, err := tap.Open(tap.Config{Name: "tp0", Netns: a, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addrA}, Up: true}})
	if err != nil {
		return nil, err
	}
	db, err := tap.Open(tap.Config{Name: "tp0", Netns: b, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addrB}, Up: true}})
	if err != nil {
		da.Close()
		return nil, err
	}
	p := NewTapPipe(da, db, mtu+14)
	return p.Close, nil
}

// buildTapPipeOffload is buildTapPipe with vnet-header TAPs whose frames
// cross with their offload metadata (OffloadTapPipe): the kernel on each
// side hands over and takes 64 KiB super frames with partial checksums.
func buildTapPipeOffload(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	da, err := tap.Open(tap.Config{Name: "tp0", Netns: a, VnetHdr: true, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addrA}, Up: true}})
	if err != nil {
		return nil, err
	}
	db, err := tap.Open(tap.Config{Name: "tp0", Netns: b, VnetHdr: true, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addrB}, Up: true}})
	if err != nil {
		da.Close()
		return nil, err
	}
	p, err := NewOffloadTapPipe(da, db)
	if err != nil {
		return nil, errors.Join(err, da.Close(), db.Close())
	}
	if err := checkTapOffloads("offload tap-pipe", da, db); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p.Close, nil
}

// checkTapOffloads fails when the kernel did not put checksum offload and
// TSO in force on a vnet TAP of an offload baseline, which would then
// measure something else.
func checkTapOffloads(baseline string, devs ...*tap.Device) error {
	for _, d := range devs {
		if want := tap.OffloadCsum | tap.OffloadTSO4 | tap.OffloadTSO6; d.Offloads()&want != want {
			return fmt.Errorf("%s: kernel refused checksum/TSO offload on a vnet TAP (%v)", baseline, d.Offloads())
		}
	}
	return nil
}
