// Command ipoib runs IP over InfiniBand as a userspace network stack: a
// lab of namespaces on a soft fabric (fabric), its inspection and control
// (show, mode), and the benchmarks (bench, soak). Run 'ipoib help'.
package main

import (
	"context"
	"fmt"
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
	// SIGHUP goes to the command: 'ipoib up --config' reloads on it, the
	// others stop cleanly as on Ctrl-C (the terminal closed).
	signal.Ignore(syscall.SIGPIPE)
	// The context's cause names the signal, for the commands that report an
	// interrupted run with its exit status (cli.Signalled).
	ctx, stop := cli.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := cli.Main(ctx, os.Args[1:], cli.Env{
		Stdout:       os.Stdout,
		Stderr:       os.Stderr,
		Euid:         os.Geteuid,
		ControlDir:   control.DefaultDir,
		MarkerDir:    tap.DefaultMarkerDir,
		Hangup:       hup,
		NotifySocket: os.Getenv("NOTIFY_SOCKET"),
		Journal:      stderrIsJournal(os.Getenv("JOURNAL_STREAM")),
	})
	stop()
	os.Exit(code)
}

// stderrIsJournal reports whether stderr is the stream $JOURNAL_STREAM
// ("device:inode") names: journald set it, and stderr was not redirected
// since (systemd.exec(5)).
func stderrIsJournal(stream string) bool {
	if stream == "" {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(os.Stderr.Fd()), &st); err != nil {
		return false
	}
	return stream == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}
