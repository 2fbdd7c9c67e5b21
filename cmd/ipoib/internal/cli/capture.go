package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

func captureFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	host := fs.String("host", "", "host whose HCA traffic to record (e.g. ipoib-h1); required when a process runs several")
	file := fs.String("w", "", "write the pcapng capture to this file (required; '-' for stdout)")
	qpn := fs.String("qpn", "", "record only traffic of this QP number (decimal or 0x hex) and its events")
	kind := fs.String("kind", "all", "record all traffic, only cm (CM MADs on QP 1) or only data (everything else)")
	count := fs.Uint64("count", 0, "stop when the file holds this many packets, as tcpdump -c: RoCEv2 frames and event records alike, what tshark lists (0: no limit)")
	duration := fs.Duration("duration", 0, "stop after this long (0: until interrupted)")
	dir := controlDirFlag(fs, env)
	return func(ctx context.Context, args []string) int {
		req := control.CaptureRequest{Kind: *kind, Count: *count, DurationMS: duration.Milliseconds()}
		if msg := firstBroken(
			noArgs(args),
			func() string {
				if *file == "" {
					return "-w FILE is required"
				}
				return ""
			},
			oneOf("kind", *kind, "all", "cm", "data"),
			check(flagcheck.Duration("duration", *duration, 0)),
			func() string {
				if *qpn == "" {
					return ""
				}
				v, err := strconv.ParseUint(*qpn, 0, 24)
				if err != nil || v == 0 {
					return fmt.Sprintf("--qpn %q: want a QP number 1..0xffffff", *qpn)
				}
				req.QPN = uint32(v)
				return ""
			},
		); msg != "" {
			return usageError(env, "capture", msg)
		}
		if *host == "" {
			if msg := captureHostNeeded(*dir); msg != "" {
				return usageError(env, "capture", msg)
			}
		}
		out := env.Stdout
		if *file != "-" {
			f, err := os.Create(*file)
			if err != nil {
				return fail(env, "capture", err)
			}
			defer f.Close()
			out = f
		}
		start := time.Now()
		info, n, err := control.Capture(ctx, *dir, *host, req, out)
		if err != nil {
			return fail(env, "capture", err)
		}
		if c, ok := out.(interface{ Close() error }); ok && *file != "-" {
			if err := c.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				return fail(env, "capture", err)
			}
		}
		fmt.Fprintf(env.Stderr, "ipoib capture: %s: %d bytes of pcapng in %v\n", info.Host, n, time.Since(start).Round(time.Millisecond))
		return ExitOK
	}
}

// captureHostNeeded is the usage message when no --host names one of
// several hosts running (in one process or in several): a capture records
// one HCA, and which one would otherwise be a guess. The message lists
// them, at most listHosts.
func captureHostNeeded(dir string) string {
	resps, _ := control.QueryAll(dir, control.Request{Op: control.OpList}, controlTimeout)
	var hosts []string
	for _, r := range resps {
		for _, i := range r.Interfaces {
			if i.Parent == "" && !slices.Contains(hosts, i.Host) {
				hosts = append(hosts, i.Host)
			}
		}
	}
	if len(hosts) < 2 {
		return ""
	}
	slices.SortFunc(hosts, control.CompareHosts)
	list := strings.Join(hosts[:min(len(hosts), listHosts)], ", ")
	if len(hosts) > listHosts {
		list += fmt.Sprintf(" and %d more ('ipoib show --brief' lists them)", len(hosts)-listHosts)
	}
	return fmt.Sprintf("--host is required: %d hosts run: %s", len(hosts), list)
}

// listHosts bounds the hosts a message names.
const listHosts = 8
