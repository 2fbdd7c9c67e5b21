package napi

import (
	"bytes"
	"runtime"
	"testing"
	"testing/synctest"

	"github.com/ipoibcm/ipoib/hca"
)

// pollGoroutines counts goroutines of a synctest bubble that are running
// Context.run. Restricting to bubbles keeps goroutines of earlier tests,
// which may still be unwinding after closing exited, out of the count.
func pollGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		if bytes.Contains(header, []byte("synctest bubble")) &&
			bytes.Contains(g, []byte("napi.(*Context).run(")) {
			n++
		}
	}
	return n
}

// TestOneGoroutinePerStartedContext: New starts nothing, Start exactly one
// goroutine, Stop ends it.
func TestOneGoroutinePerStartedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const contexts = 3
		var ctxs []*Context
		for range contexts {
			ctx, err := New(Config{CQ: newFakeCQ(4), Handle: func([]hca.WC) {}})
			if err != nil {
				t.Fatal(err)
			}
			ctxs = append(ctxs, ctx)
		}
		synctest.Wait()
		if got := pollGoroutines(); got != 0 {
			t.Fatalf("%d poll goroutines before Start, want 0", got)
		}
		for i, ctx := range ctxs {
			ctx.Start()
			ctx.Start() // a second Start must not add a goroutine
			synctest.Wait()
			if got := pollGoroutines(); got != i+1 {
				t.Fatalf("%d poll goroutines after %d Starts, want %d", got, i+1, i+1)
			}
		}
		for _, ctx := range ctxs {
			ctx.Stop()
		}
		synctest.Wait()
		if got := pollGoroutines(); got != 0 {
			t.Fatalf("%d poll goroutines after Stop, want 0", got)
		}
	})
}

// TestStopEndsHandling: after Stop returns, neither queued completions,
// events, nor Schedule reach Handle; Stop is idempotent; Start after Stop does
// nothing.
func TestStopEndsHandling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(8)
		handled := 0
		ctx, err := New(Config{CQ: cq, Handle: func(wcs []hca.WC) { handled += len(wcs) }})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		ctx.Start()
		if err := cq.add(recvWC(1), recvWC(2)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if handled != 2 {
			t.Fatalf("handled %d before Stop, want 2", handled)
		}
		if !cq.isArmed() {
			t.Fatal("CQ not re-armed after the poll")
		}

		ctx.Stop()
		ctx.Stop()
		if got := ctx.State(); got != StateStopped {
			t.Errorf("state %v after Stop, want %v", got, StateStopped)
		}
		// The CQ is still armed: this fires an event into a stopped
		// Context.
		if err := cq.add(recvWC(3)); err != nil {
			t.Fatal(err)
		}
		ctx.Schedule()
		ctx.Schedule()
		ctx.Start()
		synctest.Wait()
		if handled != 2 {
			t.Errorf("handled %d after Stop, want still 2", handled)
		}
		if got := cq.len(); got != 1 {
			t.Errorf("%d completions in CQ, want 1 left unpolled", got)
		}
		if got := pollGoroutines(); got != 0 {
			t.Errorf("%d poll goroutines after Stop, want 0", got)
		}
	})
}

// TestStopConcurrentCallersAllWait: every concurrent Stop returns only once
// the goroutine is gone, not just the first.
func TestStopConcurrentCallersAllWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(8)
		entered := make(chan struct{})
		release := make(chan struct{})
		ctx, err := New(Config{CQ: cq, Handle: func([]hca.WC) {
			close(entered)
			<-release
		}})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		ctx.Start()
		if err := cq.add(recvWC(1)); err != nil {
			t.Fatal(err)
		}
		<-entered
		returned := make(chan int, 2)
		for i := range 2 {
			go func() {
				ctx.Stop()
				returned <- i
			}()
		}
		synctest.Wait()
		select {
		case i := <-returned:
			t.Fatalf("Stop %d returned while Handle was still running", i)
		default:
		}
		close(release)
		<-returned
		<-returned
		if got := pollGoroutines(); got != 0 {
			t.Errorf("%d poll goroutines after Stop, want 0", got)
		}
	})
}

// TestStopBeforeStart: a never-started Context stops without a goroutine and
// Schedule before and after is harmless.
func TestStopBeforeStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(4)
		handled := 0
		ctx, err := New(Config{CQ: cq, Handle: func(wcs []hca.WC) { handled += len(wcs) }})
		if err != nil {
			t.Fatal(err)
		}
		if got := ctx.State(); got != StateNew {
			t.Errorf("state %v, want %v", got, StateNew)
		}
		ctx.Schedule()
		ctx.Stop()
		ctx.Stop()
		ctx.Schedule()
		if err := cq.add(recvWC(1)); err != nil {
			t.Fatal(err)
		}
		ctx.Start()
		synctest.Wait()
		if handled != 0 || pollGoroutines() != 0 {
			t.Errorf("handled %d with %d goroutines, want nothing", handled, pollGoroutines())
		}
		if got := ctx.State(); got != StateStopped {
			t.Errorf("state %v, want %v", got, StateStopped)
		}
	})
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{
		StateNew: "new", StateRunning: "running", StateStopped: "stopped", State(9): "State(9)",
	} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", int32(s), got, want)
		}
	}
	for r, want := range map[pollResult]string{
		pollArmed: "armed", pollMissed: "missed", pollExhausted: "exhausted", pollStopped: "stopped",
	} {
		if got := r.String(); got != want {
			t.Errorf("pollResult %d String() = %q, want %q", int(r), got, want)
		}
	}
}
