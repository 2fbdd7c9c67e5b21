package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// Exit statuses.
const (
	ExitOK    = 0
	ExitFail  = 1 // the command ran and failed
	ExitUsage = 2 // bad command line
)

type command struct {
	name    string
	summary string
	// flags declares the command's flags on fs and returns the runner.
	flags func(fs *flag.FlagSet, env *Env) func(ctx context.Context, args []string) int
	// positional describes positional arguments in usage, if any.
	positional string
}

func commands() []command {
	return []command{
		{name: "fabric", summary: "run N hosts in network namespaces on one soft fabric (root)", flags: fabricFlags},
		{name: "show", summary: "show counters, neighbours and connections of running interfaces", flags: showFlags},
		{name: "mode", summary: "switch running interfaces to connected or datagram mode", flags: modeFlags, positional: "connected|datagram"},
		{name: "bench", summary: "measure throughput: in-process (default) or iperf3 across namespaces (--iperf, root)", flags: benchFlags},
		{name: "soak", summary: soakSummary, flags: soakFlags},
		{name: "up", summary: "bring up ib0 on this host over RoCEv2/UDP to other hosts (root)", flags: upFlags},
		{name: "child", summary: "add or delete a P_Key child interface (ib0.8001) of a running fabric host or 'ipoib up'", flags: childFlags, positional: "add PKEY | del NAME|PKEY"},
		{name: "down", summary: "stop a running 'ipoib up' and wait until its TAPs and socket are gone", flags: downFlags},
		{name: "reload", summary: "have a running 'ipoib up --config' re-read its file and apply what can change live (as SIGHUP)", flags: reloadFlags},
		{name: "config", summary: "check an 'ipoib up' config file without starting anything", flags: configFlags, positional: "check FILE"},
		{name: "capture", summary: "record a host's HCA traffic and engine events as pcapng (RoCEv2, for tshark)", flags: captureFlags},
		{name: "cleanup", summary: "remove the marked namespaces and control sockets a crashed ipoib left (root)", flags: cleanupFlags},
		{name: "version", summary: "print the module version, VCS revision and time, and Go version", flags: versionFlags},
	}
}

// Main runs the ipoib command line and returns the exit status.
func Main(ctx context.Context, args []string, env Env) int {
	if len(args) == 0 {
		usage(env.Stdout)
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	if isHelp(name) {
		// "help <command>" is "<command> -h"; help about help, in any
		// spelling, is the overview. Dispatching directly (never through
		// Main again) keeps "help help" from recursing.
		if len(rest) == 0 || isHelp(rest[0]) {
			usage(env.Stdout)
			return ExitOK
		}
		name, rest = rest[0], []string{"-h"}
	}
	for _, c := range commands() {
		if c.name == name {
			if c.name != "up" && env.Hangup != nil {
				var cancel context.CancelFunc
				ctx, cancel = stopOnHangup(ctx, env.Hangup)
				defer cancel()
			}
			return runCommand(ctx, c, rest, &env)
		}
	}
	fmt.Fprintf(env.Stderr, "ipoib: unknown command %q (run 'ipoib help')\n", name)
	return ExitUsage
}

// stopOnHangup is ctx, ended also by a SIGHUP (the terminal closed),
// with the signal as its cause, as NotifyContext does.
func stopOnHangup(ctx context.Context, hup <-chan os.Signal) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case s := <-hup:
			cancel(Signalled{Signal: s})
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "ipoib: IP over InfiniBand (RFC 4391/4755) as a userspace network stack\n\nusage: ipoib <command> [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-7s %s\n\nrun 'ipoib <command> -h' for its flags\n", "help", "this text; 'ipoib help <command>' for one command")
}

func runCommand(ctx context.Context, c command, args []string, env *Env) int {
	fs := flag.NewFlagSet("ipoib "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.flags(fs, env)
	printUsage := func() {
		w := env.Stdout
		fmt.Fprintf(w, "%s\n\n%s\n", strings.TrimSpace("usage: ipoib "+c.name+" [flags] "+c.positional), c.summary)
		if hasFlags(fs) {
			fmt.Fprintf(w, "\nflags:\n")
			fs.SetOutput(w)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
		}
	}
	// The FlagSet calls Usage on every parse error; usage goes out only
	// for -h, so a bad flag costs exactly one line on stderr.
	fs.Usage = func() {}
	positional, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printUsage()
		return ExitOK
	}
	if err != nil {
		return usageError(env, c.name, err.Error())
	}
	return run(ctx, positional)
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parseInterspersed lets flags follow positional arguments ("ipoib mode
// datagram --host h1"), which flag.Parse alone stops at.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// usageError prints one line and returns ExitUsage.
func usageError(env *Env, cmd, msg string) int {
	fmt.Fprintln(env.Stderr, flagcheck.Usage(cmd, msg))
	return ExitUsage
}

// refuse prints one line and returns ExitUsage: the command line is
// sound but cannot run as this user (not root); nothing was created.
func refuse(env *Env, cmd, msg string) int {
	fmt.Fprintf(env.Stderr, "ipoib %s: %s\n", cmd, msg)
	return ExitUsage
}

// fail prints one line and returns ExitFail.
func fail(env *Env, cmd string, err error) int {
	fmt.Fprintf(env.Stderr, "ipoib %s: %v\n", cmd, err)
	return ExitFail
}

// levelFlag is a -log-level flag value.
type levelFlag struct{ level slog.Level }

func (l *levelFlag) String() string { return strings.ToLower(l.level.String()) }
func (l *levelFlag) Get() any       { return l.String() }
func (l *levelFlag) Set(s string) error {
	if err := l.level.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("want %s", flagcheck.LogLevels)
	}
	return nil
}

func newLogger(w io.Writer, l slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

func validMode(m string) bool { return m == "connected" || m == "datagram" }
