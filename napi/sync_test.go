package napi

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// failAfter is the failure guard for event-driven waits: it only turns a
// hang into a test failure.
const failAfter = 10 * time.Second

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(failAfter):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestSyncWaitsForPollInProgress holds a poll open inside Handle, calls Sync
// from another goroutine, and checks that fn runs only after that poll has
// returned the poll lock.
func TestSyncWaitsForPollInProgress(t *testing.T) {
	cq := newFakeCQ(8)
	entered := make(chan struct{})
	release := make(chan struct{})
	var pollsFinished atomic.Int32 // Handle returned (its poll then ends)
	ctx, err := New(Config{Name: "sync", CQ: cq, Handle: func([]hca.WC) {
		close(entered)
		<-release
		pollsFinished.Add(1)
	}})
	if err != nil {
		t.Fatal(err)
	}
	cq.onCompletion = ctx.Schedule
	ctx.Start()
	defer ctx.Stop()
	if err := cq.add(recvWC(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, entered, "Handle to start")

	syncCalled := make(chan struct{})
	fnRan := make(chan struct{})
	var sawFinished int32
	var pollsInFn uint64
	go func() {
		close(syncCalled)
		ctx.Sync(func() {
			sawFinished = pollsFinished.Load()
			pollsInFn = ctx.Stats().Polls
			close(fnRan)
		})
	}()
	waitFor(t, syncCalled, "Sync to be called")
	select {
	case <-fnRan:
		t.Fatal("Sync ran fn while a poll was in progress")
	default:
	}
	close(release)
	waitFor(t, fnRan, "Sync's fn")
	if sawFinished != 1 {
		t.Errorf("fn saw %d finished polls, want 1: it ran inside the poll", sawFinished)
	}
	if pollsInFn != 1 {
		t.Errorf("fn saw Polls=%d, want 1", pollsInFn)
	}
}

// TestSyncBlocksNewPolls: while fn runs, a scheduled poll cannot begin.
func TestSyncBlocksNewPolls(t *testing.T) {
	cq := newFakeCQ(8)
	handled := make(chan struct{}, 8)
	ctx, err := New(Config{Name: "sync", CQ: cq, Handle: func([]hca.WC) { handled <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	cq.onCompletion = ctx.Schedule
	ctx.Start()
	defer ctx.Stop()
	var pollsBefore, pollsAfter uint64
	ctx.Sync(func() {
		pollsBefore = ctx.Stats().Polls
		if err := cq.add(recvWC(1)); err != nil { // fires the event
			t.Error(err)
		}
		ctx.Schedule()
		pollsAfter = ctx.Stats().Polls
	})
	if pollsBefore != pollsAfter {
		t.Errorf("a poll began inside Sync: Polls %d -> %d", pollsBefore, pollsAfter)
	}
	waitFor(t, handled, "the completion posted inside Sync")
}

// TestSyncOutsideRunningState: before Start and after Stop there is no poll,
// and Sync still runs fn.
func TestSyncOutsideRunningState(t *testing.T) {
	ctx, err := New(Config{CQ: newFakeCQ(1), Handle: func([]hca.WC) {}})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	ctx.Sync(func() { runs++ })
	ctx.Start()
	ctx.Stop()
	ctx.Sync(func() { runs++ })
	if runs != 2 {
		t.Errorf("fn ran %d times, want 2", runs)
	}
}
