package testutil

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// AwaitGoroutines waits until at most want goroutines run, for up to
// timeout, and otherwise returns an error with the stacks of all of them.
// A goroutine's exit has no event to wait on, so the count is polled with
// a short sleep that keeps the loop from competing for the CPU.
func AwaitGoroutines(want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for runtime.NumGoroutine() > want {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			return fmt.Errorf("%d goroutines left, want <= %d:\n%s", runtime.NumGoroutine(), want, buf[:n])
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// WaitGoroutines is AwaitGoroutines with 5 s, failing the test.
func WaitGoroutines(t testing.TB, want int) {
	t.Helper()
	if err := AwaitGoroutines(want, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}
