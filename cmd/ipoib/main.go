// Command ipoib runs IP over InfiniBand as a userspace network stack: a
// lab of namespaces on a soft fabric (fabric), its inspection and control
// (show, mode), and the benchmarks (bench, soak). Run 'ipoib help'.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ipoibcm/ipoib/cmd/ipoib/internal/cli"
	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/tap"
)

func main() {
	// A log on a pipe that went away ('ipoib fabric 2>&1 | tee log', tee
	// gone first on Ctrl-C) must not kill the process with SIGPIPE before
	// it removed its namespaces, TAPs and control socket: ignored, the
	// write fails with EPIPE and the log line is lost, nothing else.
	// SIGHUP (the terminal closed) stops the run cleanly like Ctrl-C.
	signal.Ignore(syscall.SIGPIPE)
	// The context's cause names the signal, for the commands that report an
	// interrupted run with its exit status (cli.Signalled).
	ctx, stop := cli.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	code := cli.Main(ctx, os.Args[1:], cli.Env{
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		Euid:       os.Geteuid,
		ControlDir: control.DefaultDir,
		MarkerDir:  tap.DefaultMarkerDir,
	})
	stop()
	os.Exit(code)
}
