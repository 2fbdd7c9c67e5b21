package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// Exit statuses of SoakMain.
const (
	SoakExitOK        = 0
	SoakExitViolation = 1 // violations found, or the soak could not run
	SoakExitUsage     = 2
)

// SoakSummary is the one-line description of 'ipoib soak'.
const SoakSummary = "stale-connection reaping soak with fault injection"

// soakMaxHosts bounds --hosts as RunSoak does (250 × 250 addresses).
const soakMaxHosts = 250 * 250

// SoakMain is `ipoib soak`: it parses args, runs the soak with a progress
// line on stderr (rewritten in place on a terminal), prints the table (or
// --json) on stdout and returns the exit status: 1 on any violation.
func SoakMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := DefaultSoakConfig()
	fs := flag.NewFlagSet("ipoib soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long traffic runs (the end checks follow)")
	fs.IntVar(&cfg.Hosts, "hosts", cfg.Hosts, "hosts on the soft fabric")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fabric's faults and of the traffic")
	fs.Float64Var(&cfg.Faults.CompletionDelay.Probability, "delay-prob", cfg.Faults.CompletionDelay.Probability, "probability a completion is held back (delivered past destroy)")
	fs.DurationVar(&cfg.Faults.CompletionDelay.Max, "delay-max", cfg.Faults.CompletionDelay.Max, "longest completion hold-back")
	purge := fs.Bool("purge", false, "purge a destroyed QP's completions (mlx5) instead of leaving them in the CQ (rxe)")
	fs.BoolVar(&cfg.Faults.ImmediateQPNReuse, "qpn-reuse", cfg.Faults.ImmediateQPNReuse, "hand a freed QPN to the next QP at once")
	fs.Float64Var(&cfg.Faults.RNR, "rnr", cfg.Faults.RNR, "probability of an injected RNR NAK")
	fs.Float64Var(&cfg.Faults.UDLoss, "ud-loss", cfg.Faults.UDLoss, "probability a UD delivery is lost")
	fs.DurationVar(&cfg.Faults.LastWQEDelay, "lastwqe-delay", cfg.Faults.LastWQEDelay, "delay of LAST_WQE_REACHED")
	fs.Float64Var(&cfg.Faults.SpuriousCompletionEvents, "spurious", cfg.Faults.SpuriousCompletionEvents, "probability of a spurious completion event on re-arm")
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
	asJSON := fs.Bool("json", false, "print the report as JSON")
	quiet := fs.Bool("quiet", false, "no progress line")
	verbose := fs.Bool("v", false, "log engine warnings to stderr")
	// As every ipoib command: usage on -h to stdout, one line on stderr for
	// a bad flag, and every value checked before the fabric exists.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: ipoib soak [flags]\n\n%s\n\nflags:\n", SoakSummary)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return SoakExitOK
		}
		fmt.Fprintln(stderr, flagcheck.Usage("soak", err.Error()))
		return SoakExitUsage
	}
	msg := flagcheck.First(
		func() string {
			if fs.NArg() > 0 {
				return fmt.Sprintf("unexpected argument %q", fs.Arg(0))
			}
			return ""
		}(),
		flagcheck.Duration("duration", cfg.Duration, time.Millisecond),
		flagcheck.IntRange("hosts", cfg.Hosts, 2, soakMaxHosts),
		flagcheck.Probability("delay-prob", cfg.Faults.CompletionDelay.Probability),
		flagcheck.Duration("delay-max", cfg.Faults.CompletionDelay.Max, 0),
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
		flagcheck.IntRange("max-packet", cfg.MaxPacket, soakMinIP, flagcheck.MaxConnectedMTU),
		func() string {
			if !(cfg.HeapGrowth >= 1) {
				return fmt.Sprintf("--heap-growth %v: want at least 1", cfg.HeapGrowth)
			}
			return ""
		}(),
	)
	if msg != "" {
		fmt.Fprintln(stderr, flagcheck.Usage("soak", msg))
		return SoakExitUsage
	}
	if *purge {
		cfg.Faults.DestroyedQPCompletions = soft.PurgeCompletionsOnDestroy
	}
	if !*quiet {
		cfg.Progress = stderr
		cfg.ProgressTTY = isTerminal(stderr)
	}
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rep, err := RunSoak(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "ipoib soak: %v\n", err)
		if errors.Is(err, ErrSoakConfig) {
			return SoakExitUsage
		}
		return SoakExitViolation
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ipoib soak: %v\n", err)
		return SoakExitViolation
	}
	if rep.Failed() {
		return SoakExitViolation
	}
	return SoakExitOK
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
