package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
	"github.com/ipoibcm/ipoib/internal/proc"
	"github.com/ipoibcm/ipoib/tap"
)

// The service commands act on a running 'ipoib up' as a whole, through
// its control socket: down stops it and waits until what it made is gone,
// reload has it re-read its config file. version and cleanup need no
// running process.

func targetFlags(fs *flag.FlagSet, env *Env) (dev, host, dir *string) {
	dev = fs.String("dev", "ib0", "the interface whose process to act on (a parent, e.g. ib0)")
	host = fs.String("host", "", "its host name on the control socket, when several processes run one of that name")
	return dev, host, controlDirFlag(fs, env)
}

func downFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	dev, host, dir := targetFlags(fs, env)
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the process to exit")
	return func(_ context.Context, args []string) int {
		if msg := firstBroken(noArgs(args), check(flagcheck.Ifname("dev", *dev)),
			check(flagcheck.Duration("timeout", *timeout, 100*time.Millisecond))); msg != "" {
			return usageError(env, "down", msg)
		}
		t, err := control.FindProcess(*dir, *host, *dev, controlTimeout)
		if err != nil {
			return fail(env, "down", errors.New(oneLine(err)))
		}
		// The TAPs are in the process's namespace: they can be checked
		// from here only if that is this one.
		sameNetns := sameNetns(t.PID)
		resp, err := t.Ask(control.OpStop, controlTimeout)
		if err != nil {
			return fail(env, "down", errors.New(oneLine(err)))
		}
		st := resp.Stopping
		if err := waitExit(st.PID, st.Start, *timeout); err != nil {
			return fail(env, "down", fmt.Errorf("%s: %w", t.Interface.Host, err))
		}
		var left []string
		if _, err := os.Lstat(st.Socket); err == nil {
			left = append(left, "socket "+st.Socket)
		}
		if sameNetns {
			for _, d := range st.TAPs {
				if _, err := os.Lstat(filepath.Join("/sys/class/net", d)); err == nil {
					left = append(left, "TAP "+d)
				}
			}
		}
		for _, n := range st.Namespaces {
			if _, err := os.Lstat(filepath.Join("/run/netns", n)); err == nil {
				left = append(left, "namespace "+n)
			}
		}
		if len(left) > 0 {
			return fail(env, "down", fmt.Errorf("%s (pid %d) exited but left %s", t.Interface.Host, st.PID, strings.Join(left, ", ")))
		}
		gone := "TAPs " + strings.Join(st.TAPs, " ")
		if !sameNetns {
			gone = "TAPs (in another namespace, not checked)"
		}
		fmt.Fprintf(env.Stdout, "%s: down (pid %d exited): %s, socket gone\n", t.Interface.Host, st.PID, gone)
		return ExitOK
	}
}

// sameNetns reports whether process pid is in this process's network
// namespace.
func sameNetns(pid int) bool {
	mine, err1 := os.Readlink("/proc/self/ns/net")
	theirs, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	return err1 == nil && err2 == nil && mine == theirs
}

func reloadFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	dev, host, dir := targetFlags(fs, env)
	return func(_ context.Context, args []string) int {
		if msg := firstBroken(noArgs(args), check(flagcheck.Ifname("dev", *dev))); msg != "" {
			return usageError(env, "reload", msg)
		}
		t, err := control.FindProcess(*dir, *host, *dev, controlTimeout)
		if err != nil {
			return fail(env, "reload", errors.New(oneLine(err)))
		}
		// A reload may create children: more than a plain request's time.
		resp, err := t.Ask(control.OpReload, 4*controlTimeout)
		if err != nil {
			return fail(env, "reload", errors.New(oneLine(err)))
		}
		r := resp.Reload
		applied := "nothing changed"
		if len(r.Applied) > 0 {
			applied = strings.Join(r.Applied, "; ")
		}
		fmt.Fprintf(env.Stdout, "%s: reloaded: %s\n", t.Interface.Host, applied)
		if len(r.NotLive) > 0 {
			fmt.Fprintf(env.Stdout, "%s: not applied, cannot change while running (restart to apply): %s\n", t.Interface.Host, strings.Join(r.NotLive, ", "))
		}
		return ExitOK
	}
}

func versionFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	return func(_ context.Context, args []string) int {
		if msg := noArgs(args)(); msg != "" {
			return usageError(env, "version", msg)
		}
		fmt.Fprint(env.Stdout, versionText(debug.ReadBuildInfo()))
		return ExitOK
	}
}

// versionText is 'ipoib version': the module and its version, the VCS
// revision and commit time the go command stamped, and the Go release.
func versionText(bi *debug.BuildInfo, ok bool) string {
	if !ok {
		return fmt.Sprintf("ipoib: no build information\ngo: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	rev, at := set["vcs.revision"], set["vcs.time"]
	if rev == "" {
		rev = "unknown (built without VCS stamping)"
	}
	if set["vcs.modified"] == "true" {
		rev += " (modified)"
	}
	if at == "" {
		at = "unknown"
	}
	return fmt.Sprintf("ipoib: %s %s\nrevision: %s\ncommitted: %s\ngo: %s %s/%s\n",
		bi.Main.Path, bi.Main.Version, rev, at, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}

func cleanupFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	dir := controlDirFlag(fs, env)
	markers := fs.String("marker-dir", env.MarkerDir, "directory of the namespace owner markers")
	return func(_ context.Context, args []string) int {
		if msg := noArgs(args)(); msg != "" {
			return usageError(env, "cleanup", msg)
		}
		if env.Euid() != 0 {
			return refuse(env, "cleanup", "needs root to delete namespaces and sockets under /run")
		}
		owner := &tap.Owner{MarkerDir: *markers}
		nss, nsErr := owner.CleanupStale()
		socks, sockErr := control.RemoveStale(*dir)
		for _, n := range nss {
			fmt.Fprintf(env.Stdout, "removed namespace %s (its marker named a process that is gone)\n", n)
		}
		for _, s := range socks {
			fmt.Fprintf(env.Stdout, "removed socket %s\n", s)
		}
		if len(nss)+len(socks) == 0 && nsErr == nil && sockErr == nil {
			fmt.Fprintln(env.Stdout, "nothing to remove: no marked namespace or socket of a process that is gone")
		}
		if err := errors.Join(nsErr, sockErr); err != nil {
			return fail(env, "cleanup", errors.New(oneLine(err)))
		}
		return ExitOK
	}
}

// waitExit waits until process pid, started at start, has exited.
func waitExit(pid int, start uint64, timeout time.Duration) error {
	if !proc.Alive(pid, start) {
		return nil
	}
	return waitPid(pid, start, timeout)
}
