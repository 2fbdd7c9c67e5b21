package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/bench"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
	"github.com/ipoibcm/ipoib/tap"
)

// Default IP MTUs of the two modes on the soft fabric (IB MTU 4096): the
// connected-mode maximum and the UD MTU, IB MTU minus the 4-byte header.
const (
	defaultConnectedMTU = 65520
	defaultDatagramMTU  = 4096 - 4
)

func benchFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	iperf := fs.Bool("iperf", false, "run iperf3 between namespaces over ib0, veth, tap-pipe and offload tap-pipe (root, iperf3)")
	hcaName := fs.String("hca", "soft", "--iperf: backend under ib0: soft (one process, soft fabric) or rocev2 (two 'ipoib up' processes over a veth, against udp-pipe and wireguard-go baselines)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	duration := fs.Duration("duration", 5*time.Second, "--iperf: length of each iperf3 test")
	streams := fs.Int("streams", 1, "--iperf: parallel TCP streams (iperf3 -P)")
	modes := fs.String("modes", "connected,datagram", "--iperf: ib0 modes to measure, comma-separated")
	mtuCM := fs.Int("mtu-connected", defaultConnectedMTU, "--iperf: IP MTU for connected mode and its baselines")
	mtuUD := fs.Int("mtu-datagram", defaultDatagramMTU, "IP MTU for datagram mode and its baselines (--iperf and in-process)")
	seed := fs.Int64("seed", 1, "--iperf: soft fabric random seed")
	offloads := fs.String("offloads", "on", "--iperf: ib0's TAPs with a virtio header (TSO/USO, checksum offload, GRO) or without (off), as 'ipoib fabric/up --offloads'")
	queues := fs.Int("queues", defaultQueues, "--iperf: queues of ib0's TAPs (1..16, with --offloads on), as 'ipoib fabric/up --queues'")
	size := fs.Int64("bytes", 256<<20, "in-process: bytes to transfer per run")
	mtu := fs.Int("mtu", defaultConnectedMTU, "in-process: IP MTU of the direct and ib0 connected rows")
	runs := fs.Int("runs", 1, "in-process: runs per row, the report shows the median")
	plotFile := fs.String("plot", "", "draw the rows as bars against their baselines, with the ratios, to this SVG file")
	prof := addProfileFlagsUsage(fs, "write a CPU profile of the whole run to this file (go tool pprof); with --hca rocev2 each 'ipoib up' also writes its own, to FILE.MODE.a and FILE.MODE.b")
	return func(ctx context.Context, args []string) (code int) {
		if msg := checkBench(args, flagcheck.Set(fs), benchArgs{*iperf, *hcaName, *modes, *offloads, *duration, *streams, *queues, *mtuCM, *mtuUD, *size, *mtu, *runs}, prof); msg != "" {
			return usageError(env, "bench", msg)
		}
		vnet := *offloads == "on"
		stopProfile, err := prof.start()
		if err != nil {
			return fail(env, "bench", err)
		}
		defer func() {
			if err := stopProfile(); err != nil && code == ExitOK {
				code = fail(env, "bench", err)
			}
		}()
		if !*iperf {
			opts := inProcOptions{Bytes: *size, MTU: *mtu, DatagramMTU: *mtuUD, Runs: *runs, JSON: *asJSON, Plot: *plotFile, Progress: env.Stderr}
			if err := runInProc(ctx, opts, env.Stdout); err != nil {
				return fail(env, "bench", err)
			}
			return ExitOK
		}
		modeList := strings.Split(*modes, ",")
		if env.Euid() != 0 {
			return refuse(env, "bench", "--iperf needs root (network namespaces, TAP devices); 'ipoib bench' without --iperf runs in-process without root")
		}
		if err := bench.CheckIperfTools(); err != nil {
			return fail(env, "bench", err)
		}
		if *hcaName == "rocev2" {
			return benchRoCEv2(ctx, env, bench.RoCEv2SuiteConfig{
				Modes: modeList, MTU: map[string]int{"connected": *mtuCM, "datagram": *mtuUD},
				Duration: *duration, Streams: *streams,
				Owner: &tap.Owner{MarkerDir: env.MarkerDir}, Progress: env.Stderr,
				UpArgs: []string{"--offloads", *offloads, "--queues", strconv.Itoa(*queues)}, IBOffloads: vnet,
				UpCPUProfile: *prof.cpuProfile,
			}, *asJSON, *plotFile)
		}
		cfg := bench.IperfSuiteConfig{
			Modes:    modeList,
			MTU:      map[string]int{"connected": *mtuCM, "datagram": *mtuUD},
			Duration: *duration,
			Streams:  *streams,
			Owner:    &tap.Owner{MarkerDir: env.MarkerDir},
			Progress: env.Stderr,
		}
		cfg.IB, cfg.IBOffloads = ibLinkFactory(*seed, vnet, *queues, newLogger(env.Stderr, slog.LevelWarn)), vnet
		rep, err := bench.RunIperfSuite(ctx, cfg)
		if err != nil {
			return fail(env, "bench", err)
		}
		return writeReport(env, rep, *asJSON, *plotFile)
	}
}

// Flags that only one kind of bench run reads. Given to the other kind
// they would be ignored and the user would believe they measured what
// they asked for.
var (
	iperfOnlyFlags  = []string{"hca", "duration", "streams", "modes", "mtu-connected", "seed", "offloads", "queues"}
	inProcOnlyFlags = []string{"bytes", "mtu", "runs"}
)

// benchArgs is the bench command line checkBench validates.
type benchArgs struct {
	iperf                bool
	hca, modes, offloads string
	duration             time.Duration
	streams, queues      int
	mtuConnected, mtuUD  int
	bytes                int64
	mtu, runs            int
}

// checkBench validates the bench command line; "" means valid. The
// in-process rows run over gVisor hosts, which need IPv6's 1280 bytes.
func checkBench(args []string, set map[string]bool, a benchArgs, prof *profileFlags) string {
	maxUD := fabricIBMTU - flagcheck.IPoIBHeaderLen
	rules := []rule{
		noArgs(args),
		onlyWith(set, a.iperf, "--iperf runs", iperfOnlyFlags...),
		func() string {
			for _, f := range inProcOnlyFlags {
				if set[f] && a.iperf {
					return fmt.Sprintf("--%s applies to in-process runs only (without --iperf)", f)
				}
			}
			return ""
		},
	}
	if !a.iperf {
		rules = append(rules,
			func() string {
				if a.bytes < 1 {
					return fmt.Sprintf("--bytes %d: want at least 1", a.bytes)
				}
				return ""
			},
			check(flagcheck.IntRange("mtu", a.mtu, 1280, flagcheck.MaxConnectedMTU)),
			check(flagcheck.IntRange("mtu-datagram", a.mtuUD, 1280, maxUD)),
			check(flagcheck.IntRange("runs", a.runs, 1, 1000)),
		)
	} else {
		rules = append(rules,
			func() string {
				for _, m := range strings.Split(a.modes, ",") {
					if !validMode(m) {
						return fmt.Sprintf("--modes: %q is not connected or datagram", m)
					}
				}
				return ""
			},
			oneOf("hca", a.hca, "soft", "rocev2"),
			oneOf("offloads", a.offloads, "on", "off"),
			check(flagcheck.Duration("duration", a.duration, time.Second)),
			check(flagcheck.IntRange("streams", a.streams, 1, 128)),
			func() string { return checkQueues(a.queues, a.offloads) },
			check(flagcheck.IntRange("mtu-connected", a.mtuConnected, flagcheck.MinIPMTU, flagcheck.MaxConnectedMTU)),
			check(flagcheck.IntRange("mtu-datagram", a.mtuUD, flagcheck.MinIPMTU, maxUD)),
		)
	}
	return firstBroken(append(rules, prof.rules()...)...)
}

// benchReport is what every iperf suite's report can do: print itself
// and say whether a run failed (an iperf3 that did not finish, not a
// ratio: the command reports ratios and judges none).
type benchReport interface {
	WriteJSON(w io.Writer) error
	WriteTable(w io.Writer) error
	Chart() bench.BarChart
	Failed() bool
}

// writeReport prints rep to stdout as JSON or a table and turns it into
// the exit code: a write error fails the command, a failed run is
// ExitFail.
func writeReport(env *Env, rep benchReport, asJSON bool, plotFile string) int {
	var err error
	if asJSON {
		err = rep.WriteJSON(env.Stdout)
	} else {
		err = rep.WriteTable(env.Stdout)
	}
	if err == nil && plotFile != "" {
		err = writePlotFile(plotFile, rep.Chart().WriteSVG)
	}
	if err != nil {
		return fail(env, "bench", err)
	}
	if rep.Failed() {
		return ExitFail
	}
	return ExitOK
}

// ibLinkFactory joins namespaces a and b with ib0: a TAP in each, two
// interfaces on a fresh soft fabric.
func ibLinkFactory(seed int64, vnet bool, queues int, log *slog.Logger) bench.IBLinkFactory {
	return func(_ context.Context, mode string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
		fab := newSoftFabric(seed, nil, log)
		var hosts []*softHost
		stop := func() error {
			var errs []error
			for _, h := range hosts {
				errs = append(errs, h.Close())
			}
			return errors.Join(append(errs, fab.Close())...)
		}
		for _, side := range []struct {
			ns   *tap.Netns
			addr netip.Prefix
		}{{a, addrA}, {b, addrB}} {
			dev, err := tap.Open(tap.Config{Name: "ib0", Netns: side.ns, VnetHdr: vnet, Queues: queues, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{side.addr}}})
			if err != nil {
				return nil, errors.Join(err, stop())
			}
			h, err := fab.AddHost(side.ns.Name(), "ib0", side.ns, dev, []netip.Prefix{side.addr}, mode, mtu)
			if err != nil {
				dev.Close()
				return nil, errors.Join(err, stop())
			}
			hosts = append(hosts, h)
		}
		return stop, nil
	}
}
