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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
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
