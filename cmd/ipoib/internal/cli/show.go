package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

const controlTimeout = 5 * time.Second

func controlDirFlag(fs *flag.FlagSet, env *Env) *string {
	def := env.ControlDir
	if def == "" {
		def = control.DefaultDir
	}
	return fs.String("control-dir", def, "directory of the running processes' control sockets")
}

func showFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	asJSON := fs.Bool("json", false, "print JSON: an array of {interface, stats} sorted by host, every counter present (schema: docs/counters.md)")
	host := fs.String("host", "", "show only this host (e.g. ipoib-h1), its children included; default all")
	dev := fs.String("dev", "", "show only the interface of this name (e.g. a child, ib0.8001)")
	brief := fs.Bool("brief", false, "one line per interface: mode, MTU, state, packets, drops, connections")
	all := fs.Bool("s", false, "show every counter, zeros included (default: only those that moved)")
	watch := fs.Bool("watch", false, "print per-second rates (packets, Mbit/s, drops) every --interval until interrupted")
	interval := fs.Duration("interval", time.Second, "--watch: time between samples")
	count := fs.Int("count", 0, "--watch: stop after this many rate lines per interface (0: until interrupted)")
	peers := fs.Bool("peers", false, "one line per peer: GID, IP, hardware address, connection state each way, last receive, bytes each way, retransmits (also 'ipoib show peers')")
	flat := fs.Bool("S", false, "every counter as one 'name: value' line with stable dotted names, like ethtool -S")
	dir := controlDirFlag(fs, env)
	return func(ctx context.Context, args []string) int {
		if len(args) == 1 && args[0] == "peers" {
			*peers, args = true, nil
		}
		set := flagcheck.Set(fs)
		if msg := firstBroken(
			func() string {
				if len(args) > 0 {
					return fmt.Sprintf("unexpected argument %q (only 'peers')", args[0])
				}
				return ""
			},
			func() string {
				if countTrue(*peers, *flat, *asJSON, *brief, *watch) > 1 {
					return "pick one of peers, -S, --json, --brief, --watch"
				}
				return ""
			},
			optIfname("dev", *dev),
			onlyWith(set, *watch, "--watch", "interval", "count"),
			func() string {
				if *interval < 10*time.Millisecond {
					return fmt.Sprintf("--interval %v is below 10ms", *interval)
				}
				return ""
			},
			func() string {
				if *count < 0 {
					return fmt.Sprintf("--count %d: want 0 (until interrupted) or more", *count)
				}
				return ""
			},
		); msg != "" {
			return usageError(env, "show", msg)
		}
		req := control.Request{Op: control.OpStats, Host: *host, Name: *dev}
		if *watch {
			return watchRates(ctx, env, *dir, req, *interval, *count)
		}
		snaps, err := queryStats(*dir, req)
		if err != nil && len(snaps) == 0 {
			return fail(env, "show", err)
		}
		var ferr error
		switch {
		case *asJSON:
			enc := json.NewEncoder(env.Stdout)
			enc.SetIndent("", "  ")
			ferr = enc.Encode(snaps)
		case *brief:
			ferr = control.FormatBrief(env.Stdout, snaps)
		case *peers:
			ferr = control.FormatPeers(env.Stdout, snaps)
		case *flat:
			ferr = control.FormatFlat(env.Stdout, snaps)
		default:
			opts := control.FormatOptions{ShowZero: *all}
			for i, s := range snaps {
				if i > 0 {
					fmt.Fprintln(env.Stdout)
				}
				if ferr = opts.Format(env.Stdout, s); ferr != nil {
					break
				}
			}
		}
		if ferr != nil {
			return fail(env, "show", ferr)
		}
		if err != nil {
			// Some process answered, another did not: show what we have,
			// then report.
			return fail(env, "show", err)
		}
		return ExitOK
	}
}

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// queryStats gathers every process's snapshots, sorted by host. The
// slice is never nil, so --json prints [] rather than null.
func queryStats(dir string, req control.Request) ([]control.InterfaceStats, error) {
	resps, err := control.QueryAll(dir, req, controlTimeout)
	all := []control.InterfaceStats{}
	for _, r := range resps {
		all = append(all, r.Stats...)
	}
	control.SortInterfaces(all)
	return all, err
}

// watchRates samples every interval and prints the rates since the
// previous sample, until ctx ends or count rounds are printed.
func watchRates(ctx context.Context, env *Env, dir string, req control.Request, interval time.Duration, count int) int {
	sample := func() (control.Sample, error) {
		all, err := queryStats(dir, req)
		return control.Sample{At: time.Now(), Stats: all}, err
	}
	prev, err := sample()
	if err != nil {
		return fail(env, "show", err)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; count == 0 || n < count; n++ {
		select {
		case <-ctx.Done():
			return ExitOK
		case <-tick.C:
		}
		cur, err := sample()
		if err != nil {
			return fail(env, "show", err)
		}
		if n > 0 {
			fmt.Fprintln(env.Stdout)
		}
		fmt.Fprintf(env.Stdout, "%s  rates over %v\n", cur.At.Format("15:04:05"), cur.At.Sub(prev.At).Round(time.Millisecond))
		if err := control.FormatRates(env.Stdout, prev, cur); err != nil {
			return fail(env, "show", err)
		}
		prev = cur
	}
	return ExitOK
}

func modeFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	host := fs.String("host", "", "switch only this host (its children too); default every interface of every running process, all or none")
	dev := fs.String("dev", "", "switch only the interface of this name (e.g. a child, ib0.8001)")
	dir := controlDirFlag(fs, env)
	return func(_ context.Context, args []string) int {
		if msg := firstBroken(
			func() string {
				if len(args) != 1 || !validMode(args[0]) {
					return "want exactly one of: connected, datagram"
				}
				return ""
			},
			optIfname("dev", *dev),
		); msg != "" {
			return usageError(env, "mode", msg)
		}
		infos, err := control.SetModeAll(*dir, *host, *dev, args[0], controlTimeout)
		if err != nil {
			return fail(env, "mode", errors.New(oneLine(err)))
		}
		for _, i := range infos {
			fmt.Fprintf(env.Stdout, "%s: %s: mode %s mtu %d\n", i.Host, i.Name, i.Mode, i.MTU)
		}
		return ExitOK
	}
}
