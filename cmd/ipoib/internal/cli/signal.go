package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

// Signalled is the cause of Main's context when a signal stopped the
// command (NotifyContext). A command that stops early on it and says so
// exits with ExitCode, as a shell reports a process the signal killed.
type Signalled struct{ Signal os.Signal }

// Error reads as os/signal's NotifyContext cause does.
func (s Signalled) Error() string { return s.Signal.String() + " signal received" }

// Is makes a Signalled a context.Canceled, as the cause of a cancelled
// context is.
func (s Signalled) Is(target error) bool { return target == context.Canceled }

// ExitCode is 128 plus the signal's number: 130 for SIGINT, 143 for
// SIGTERM, 129 for SIGHUP; ExitFail for a signal without a number.
func (s Signalled) ExitCode() int {
	if n, ok := s.Signal.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return ExitFail
}

// NotifyContext is signal.NotifyContext with the signal kept: the
// context's cause is a Signalled naming it. Further signals are diverted
// until stop is called, so a cleanup in progress is not cut short.
func NotifyContext(parent context.Context, sigs ...os.Signal) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case s := <-ch:
			cancel(Signalled{Signal: s})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(nil)
	}
}

// interruptedExit is the exit status of a command that ctx stopped early:
// the signal's ExitCode, or ExitFail if ctx ended for another reason.
func interruptedExit(ctx context.Context) int {
	var s Signalled
	if errors.As(context.Cause(ctx), &s) {
		return s.ExitCode()
	}
	return ExitFail
}
