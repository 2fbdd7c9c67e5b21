package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/ipoibcm/ipoib/bench"
	"github.com/ipoibcm/ipoib/control"
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
	asJSON := fs.Bool("json", false, "print JSON (one array of {interface, stats}) for scripts")
	host := fs.String("host", "", "show only this host (e.g. ipoib-h1); default all")
	dir := controlDirFlag(fs, env)
	return func(_ context.Context, args []string) int {
		if len(args) > 0 {
			return usageError(env, "show", fmt.Sprintf("unexpected argument %q", args[0]))
		}
		resps, err := control.QueryAll(*dir, control.Request{Op: control.OpStats, Host: *host}, controlTimeout)
		if err != nil && len(resps) == 0 {
			return fail(env, "show", err)
		}
		var all []control.InterfaceStats
		for _, r := range resps {
			all = append(all, r.Stats...)
		}
		if *asJSON {
			enc := json.NewEncoder(env.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(all); err != nil {
				return fail(env, "show", err)
			}
		} else {
			for i, s := range all {
				if i > 0 {
					fmt.Fprintln(env.Stdout)
				}
				if ferr := control.Format(env.Stdout, s); ferr != nil {
					return fail(env, "show", ferr)
				}
			}
		}
		if err != nil {
			// Some process answered, another did not: show what we have,
			// then report.
			return fail(env, "show", err)
		}
		return ExitOK
	}
}

func modeFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	host := fs.String("host", "", "switch only this host; required when a process runs several")
	dir := controlDirFlag(fs, env)
	return func(_ context.Context, args []string) int {
		if len(args) != 1 || !validMode(args[0]) {
			return usageError(env, "mode", "want exactly one of: connected, datagram")
		}
		resps, err := control.QueryAll(*dir, control.Request{Op: control.OpMode, Host: *host, Mode: args[0]}, controlTimeout)
		for _, r := range resps {
			for _, i := range r.Interfaces {
				fmt.Fprintf(env.Stdout, "%s: %s: mode %s mtu %d\n", i.Host, i.Name, i.Mode, i.MTU)
			}
		}
		if err != nil {
			return fail(env, "mode", err)
		}
		return ExitOK
	}
}

func soakFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	// The soak parses its own flags (bench.Soak); everything after "soak"
	// goes to it, so "ipoib soak -h" is answered there.
	return func(ctx context.Context, args []string) int {
		return bench.SoakMain(ctx, args, env.Stdout, env.Stderr)
	}
}
