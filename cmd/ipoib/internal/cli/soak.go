package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
	"github.com/ipoibcm/ipoib/soak"
)

// soakSummary is the one-line description of 'ipoib soak'.
const soakSummary = "stale-connection reaping soak with fault injection"

// soakFlags is `ipoib soak`: it turns the flags into a soak.Config, every
// value checked before the fabric exists, runs the soak with a progress
// line on stderr (rewritten in place on a terminal), prints the table (or
// --json) on stdout and exits 1 on any violation. A soak a signal
// interrupted reports what ran, says INTERRUPTED and exits 128+signal
// (130 for SIGINT, 143 for SIGTERM), whatever it saw.
func soakFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	cfg := soak.DefaultConfig()
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long traffic runs (the end checks follow)")
	fs.StringVar(&cfg.HCA, "hca", cfg.HCA, "HCA backend: soft (in-process fabric) or rocev2 (one loopback UDP socket per host)")
	fs.IntVar(&cfg.Hosts, "hosts", cfg.Hosts, "hosts on the fabric")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fabric's faults and of the traffic")
	delayProb := fs.Float64("delay-prob", cfg.Faults.CompletionDelay.Probability, "probability a completion is held back (delivered past destroy)")
	delayMax := fs.Duration("delay-max", cfg.Faults.CompletionDelay.Max, "longest completion hold-back")
	r := &cfg.RoCEv2
	fs.BoolVar(&r.IPv6, "ipv6", r.IPv6, "rocev2: IPv6 loopback addresses in a private network namespace (needs CAP_SYS_ADMIN)")
	fs.Float64Var(&r.Faults.Drop, "udp-loss", r.Faults.Drop, "rocev2: probability a datagram is lost")
	fs.Float64Var(&r.Faults.Duplicate, "udp-dup", r.Faults.Duplicate, "rocev2: probability an RC datagram is sent twice")
	fs.Float64Var(&r.Faults.Reorder, "udp-reorder", r.Faults.Reorder, "rocev2: probability an RC datagram swaps with the next")
	fs.Float64Var(&r.Faults.Delay, "udp-delay", r.Faults.Delay, "rocev2: probability an RC datagram is delayed")
	fs.DurationVar(&r.Faults.DelayTime, "udp-delay-time", r.Faults.DelayTime, "rocev2: how long a delayed datagram waits")
	purge := fs.Bool("purge", false, "soft: purge a destroyed QP's completions (mlx5) instead of leaving them in the CQ (rxe)")
	fs.BoolVar(&cfg.Faults.ImmediateQPNReuse, "qpn-reuse", cfg.Faults.ImmediateQPNReuse, "soft: hand a freed QPN to the next QP at once")
	fs.Float64Var(&cfg.Faults.RNR, "rnr", cfg.Faults.RNR, "soft: probability of an injected RNR NAK")
	fs.Float64Var(&cfg.Faults.UDLoss, "ud-loss", cfg.Faults.UDLoss, "soft: probability a UD delivery is lost")
	fs.DurationVar(&cfg.Faults.LastWQEDelay, "lastwqe-delay", cfg.Faults.LastWQEDelay, "soft: delay of LAST_WQE_REACHED")
	fs.Float64Var(&cfg.Faults.SpuriousCompletionEvents, "spurious", cfg.Faults.SpuriousCompletionEvents, "soft: probability of a spurious completion event on re-arm")
	fs.DurationVar(&cfg.StaleAfter, "stale-after", cfg.StaleAfter, "passive connections idle this long are reaped")
	fs.DurationVar(&cfg.StaleScan, "stale-scan", cfg.StaleScan, "period of the stale scan")
	fs.DurationVar(&cfg.StaleUpdate, "stale-update", cfg.StaleUpdate, "LRU stamp refresh period (0: stale-after/2)")
	fs.DurationVar(&cfg.NeighbourTimeout, "neigh-timeout", cfg.NeighbourTimeout, "TX connections unused this long are disconnected")
	fs.IntVar(&cfg.SendQueueSize, "sendq", cfg.SendQueueSize, "send queue size and TX credits per interface")
	fs.IntVar(&cfg.RecvQueueSize, "recvq", cfg.RecvQueueSize, "SRQ and UD ring size per interface")
	fs.IntVar(&cfg.BurstMax, "burst", cfg.BurstMax, "largest burst of packets to one peer")
	fs.IntVar(&cfg.MaxPacket, "max-packet", cfg.MaxPacket, "largest IP packet (up to the connected MTU, 65520)")
	fs.Float64Var(&cfg.HeapGrowth, "heap-growth", cfg.HeapGrowth, "heap limit as a multiple of the heap at start (plus 128 MiB)")
	fs.BoolVar(&cfg.Mutations.SkipDeadFlag, "unsafe-skip-dead-flag", false, "mutation: do not mark torn-down connections dead (must fail)")
	fs.BoolVar(&cfg.Mutations.SkipDrain, "unsafe-skip-drain", false, "mutation: destroy QPs without LAST_WQE and drain (must fail)")
	fs.StringVar(&cfg.Capture, "capture", "", "keep a ring of the last packets and engine events; write it to this pcapng file if an invariant breaks")
	fs.IntVar(&cfg.CapturePackets, "capture-packets", soak.DefaultCapturePackets, "--capture: ring size in records (messages and events; at most 32 MiB)")
	fs.StringVar(&cfg.Metrics, "metrics", "", "serve Prometheus/OpenMetrics metrics at http://ADDR/metrics while traffic runs (e.g. 127.0.0.1:9101)")
	plotFile := fs.String("plot", "", "draw the run as a timeline to this SVG file (live, established, reaped, dead-dropped per second, violations)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	quiet := fs.Bool("quiet", false, "no progress line")
	verbose := fs.Bool("v", false, "log engine warnings to stderr")
	return func(ctx context.Context, args []string) int {
		if msg := checkSoak(&cfg, args, flagcheck.Set(fs), *delayProb, *delayMax); msg != "" {
			return usageError(env, "soak", msg)
		}
		if *purge {
			cfg.Faults.DestroyedQPCompletions = soft.PurgeCompletionsOnDestroy
		}
		if !*quiet {
			cfg.Progress = env.Stderr
			cfg.ProgressTTY = isTerminal(env.Stderr)
		}
		if *verbose {
			cfg.Logger = slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
		rep, err := soak.Run(ctx, cfg)
		if err != nil {
			if errors.Is(err, soak.ErrConfig) {
				fmt.Fprintf(env.Stderr, "ipoib soak: %v\n", err)
				return ExitUsage
			}
			return fail(env, "soak", err)
		}
		if *asJSON {
			err = rep.WriteJSON(env.Stdout)
		} else {
			err = rep.WriteTable(env.Stdout)
		}
		if err == nil && *plotFile != "" {
			err = writePlotFile(*plotFile, rep.WritePlot)
		}
		if err != nil {
			return fail(env, "soak", err)
		}
		switch {
		case rep.Interrupted != "":
			return interruptedExit(ctx)
		case rep.Failed():
			return ExitFail
		}
		return ExitOK
	}
}

// checkSoak checks every value of the command line, points the completion
// hold-back flags at the chosen backend, and returns the usage message,
// "" if none.
func checkSoak(cfg *soak.Config, args []string, set map[string]bool, delayProb float64, delayMax time.Duration) string {
	maxHosts := soak.MaxHosts
	if cfg.HCA == soak.HCARoCEv2 {
		maxHosts = rocev2.MaxLoopbackDevices
	}
	return firstBroken(
		noArgs(args),
		func() string { return applySoakBackendFlags(cfg, set, delayProb, delayMax) },
		func() string { return flagcheck.First(soakValues(cfg, maxHosts, delayProb, delayMax)...) },
		onlyWith(set, cfg.Capture != "", "--capture", "capture-packets"),
		check(flagcheck.IntRange("capture-packets", cfg.CapturePackets, minCaptureRecords, maxCaptureRecords)),
		listenAddr("metrics", cfg.Metrics),
	)
}

// The --capture ring's size in records: the ring keeps at least 16
// (capture.NewRing), and its 32 MiB bound stops it long before 16 Mi.
const (
	minCaptureRecords = 16
	maxCaptureRecords = 1 << 24
)

// soakValues are the messages of the soak's numeric flags, in flag order.
func soakValues(cfg *soak.Config, maxHosts int, delayProb float64, delayMax time.Duration) []string {
	return []string{
		flagcheck.Duration("duration", cfg.Duration, time.Millisecond),
		flagcheck.IntRange("hosts", cfg.Hosts, 2, maxHosts),
		flagcheck.Probability("delay-prob", delayProb),
		flagcheck.Duration("delay-max", delayMax, 0),
		flagcheck.Probability("udp-loss", cfg.RoCEv2.Faults.Drop),
		flagcheck.Probability("udp-dup", cfg.RoCEv2.Faults.Duplicate),
		flagcheck.Probability("udp-reorder", cfg.RoCEv2.Faults.Reorder),
		flagcheck.Probability("udp-delay", cfg.RoCEv2.Faults.Delay),
		flagcheck.Duration("udp-delay-time", cfg.RoCEv2.Faults.DelayTime, 0),
		flagcheck.Probability("rnr", cfg.Faults.RNR),
		flagcheck.Probability("ud-loss", cfg.Faults.UDLoss),
		flagcheck.Probability("spurious", cfg.Faults.SpuriousCompletionEvents),
		flagcheck.Duration("lastwqe-delay", cfg.Faults.LastWQEDelay, 0),
		flagcheck.Duration("stale-after", cfg.StaleAfter, time.Millisecond),
		flagcheck.Duration("stale-scan", cfg.StaleScan, time.Millisecond),
		flagcheck.Duration("stale-update", cfg.StaleUpdate, 0),
		flagcheck.Duration("neigh-timeout", cfg.NeighbourTimeout, time.Millisecond),
		flagcheck.IntRange("sendq", cfg.SendQueueSize, 4, 1<<16),
		flagcheck.IntRange("recvq", cfg.RecvQueueSize, 4, 1<<16),
		flagcheck.IntRange("burst", cfg.BurstMax, 1, 1<<16),
		flagcheck.IntRange("max-packet", cfg.MaxPacket, soak.MinPacket, flagcheck.MaxConnectedMTU),
		func() string {
			if !(cfg.HeapGrowth >= 1) {
				return fmt.Sprintf("--heap-growth %v: want at least 1", cfg.HeapGrowth)
			}
			return ""
		}(),
	}
}

// Flags that configure one soak backend only.
var (
	soakSoftOnlyFlags   = []string{"purge", "qpn-reuse", "rnr", "ud-loss", "lastwqe-delay", "spurious"}
	soakRoCEv2OnlyFlags = []string{"ipv6", "udp-loss", "udp-dup", "udp-reorder", "udp-delay", "udp-delay-time"}
)

// applySoakBackendFlags refuses an unknown backend and flags of the other
// backend, and points the completion hold-back flags at the chosen one:
// the soft fabric's completion delay or the RoCEv2 devices' held
// completions. It returns the usage message, "" if none.
func applySoakBackendFlags(cfg *soak.Config, set map[string]bool, delayProb float64, delayMax time.Duration) string {
	var other []string
	switch cfg.HCA {
	case soak.HCASoft:
		other = soakRoCEv2OnlyFlags
	case soak.HCARoCEv2:
		other = soakSoftOnlyFlags
	default:
		return fmt.Sprintf("--hca %q: want %s or %s", cfg.HCA, soak.HCASoft, soak.HCARoCEv2)
	}
	for _, name := range other {
		if set[name] {
			return fmt.Sprintf("--%s does not apply to --hca %s", name, cfg.HCA)
		}
	}
	if cfg.HCA == soak.HCASoft {
		cfg.Faults.CompletionDelay.Probability, cfg.Faults.CompletionDelay.Max = delayProb, delayMax
		return ""
	}
	if set["delay-prob"] {
		cfg.RoCEv2.Faults.HoldCompletion = delayProb
	}
	if set["delay-max"] {
		cfg.RoCEv2.Faults.HoldCompletionMax = delayMax
	}
	return ""
}

// isTerminal reports whether w is a character device (a terminal), where
// the progress line is rewritten in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
