package cli

import (
	"context"
	"errors"
	"syscall"
	"testing"
)

// TestNotifyContextNamesTheSignal: a signal ends the context with a
// Signalled cause that is also context.Canceled, and the exit status a
// shell would report for it.
func TestNotifyContextNamesTheSignal(t *testing.T) {
	ctx, stop := NotifyContext(context.Background(), syscall.SIGUSR1)
	defer stop()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	var s Signalled
	if !errors.As(context.Cause(ctx), &s) || s.Signal != syscall.SIGUSR1 {
		t.Fatalf("cause %v, want Signalled{SIGUSR1}", context.Cause(ctx))
	}
	if !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Fatal("a Signalled cause is not context.Canceled")
	}
	if got := interruptedExit(ctx); got != 128+int(syscall.SIGUSR1) {
		t.Fatalf("exit %d, want %d", got, 128+int(syscall.SIGUSR1))
	}
	for sig, want := range map[syscall.Signal]int{syscall.SIGINT: 130, syscall.SIGTERM: 143, syscall.SIGHUP: 129} {
		if got := (Signalled{Signal: sig}).ExitCode(); got != want {
			t.Errorf("%v: exit %d, want %d", sig, got, want)
		}
	}
	ctx2, cancel := context.WithCancel(context.Background())
	cancel()
	if got := interruptedExit(ctx2); got != ExitFail {
		t.Fatalf("a context cancelled without a signal: exit %d, want %d", got, ExitFail)
	}
}
