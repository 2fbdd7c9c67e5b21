package napi

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// TestBusyPollReapsWithoutWakeups: once a busy poller owns re-arming, the
// goroutine's poll leaves the CQ unarmed, so the completions the busy
// poller reaps raise no event and wake nobody; EndBusyPoll arms again.
func TestBusyPollReapsWithoutWakeups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(64)
		handled := 0
		ctx, err := New(Config{Name: "busy", CQ: cq, Handle: func(wcs []hca.WC) { handled += len(wcs) }})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		ctx.Start()
		defer ctx.Stop()
		synctest.Wait()

		if n := ctx.BusyPoll(); n != 0 {
			t.Fatalf("BusyPoll of an empty CQ returned %d", n)
		}
		// The CQ is still armed from Start: one event, one wake-up, and
		// that poll leaves the CQ unarmed for the busy poller.
		must(t, cq.add(recvWC(1), recvWC(2), recvWC(3)))
		synctest.Wait()
		if handled != 3 || cq.isArmed() {
			t.Fatalf("handled %d armed %v after the first event, want 3 and unarmed", handled, cq.isArmed())
		}
		for round := range 10 {
			must(t, cq.add(recvWC(uint64(10+2*round)), recvWC(uint64(11+2*round))))
			if n := ctx.BusyPoll(); n != 2 {
				t.Fatalf("round %d: BusyPoll handled %d, want 2", round, n)
			}
		}
		synctest.Wait()
		st := ctx.Stats()
		if handled != 23 || st.Wakeups != 1 || cq.events.Load() != 1 || st.BusyPolls != 11 || st.LeftUnarmed != 1 {
			t.Fatalf("handled %d, wakeups %d, events %d, busy polls %d, left unarmed %d; want 23, 1, 1, 11, 1",
				handled, st.Wakeups, cq.events.Load(), st.BusyPolls, st.LeftUnarmed)
		}
		if st.Completions != 23 {
			t.Fatalf("Completions %d, want 23 (busy polls count)", st.Completions)
		}

		ctx.EndBusyPoll()
		if !cq.isArmed() || ctx.Stats().BusyPollEnds != 1 {
			t.Fatalf("EndBusyPoll: armed %v ends %d, want armed and 1", cq.isArmed(), ctx.Stats().BusyPollEnds)
		}
		ctx.EndBusyPoll() // idempotent
		if ctx.Stats().BusyPollEnds != 1 {
			t.Fatalf("second EndBusyPoll counted")
		}
		// Back to ordinary NAPI: the event wakes the goroutine, which
		// re-arms.
		must(t, cq.add(recvWC(99)))
		synctest.Wait()
		if handled != 24 || ctx.Stats().Wakeups != 2 || !cq.isArmed() {
			t.Fatalf("after EndBusyPoll: handled %d wakeups %d armed %v; want 24, 2, armed", handled, ctx.Stats().Wakeups, cq.isArmed())
		}
	})
}

// TestEndBusyPollReportsMissed: completions that landed on the unarmed CQ
// after the busy poller's last poll are found by EndBusyPoll's re-arm and
// polled, not lost.
func TestEndBusyPollReportsMissed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(8)
		handled := 0
		ctx, err := New(Config{Name: "missed", CQ: cq, Handle: func(wcs []hca.WC) { handled += len(wcs) }})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		ctx.Start()
		defer ctx.Stop()
		synctest.Wait()
		ctx.BusyPoll()
		must(t, cq.add(recvWC(1))) // consumes Start's arm: the goroutine polls, leaves unarmed
		synctest.Wait()
		must(t, cq.add(recvWC(2))) // unarmed: no event
		synctest.Wait()
		if handled != 1 || cq.len() != 1 {
			t.Fatalf("handled %d queued %d, want 1 and 1 before EndBusyPoll", handled, cq.len())
		}
		ctx.EndBusyPoll()
		synctest.Wait()
		if handled != 2 || cq.len() != 0 || !cq.isArmed() {
			t.Fatalf("after EndBusyPoll: handled %d queued %d armed %v; want 2, 0, armed", handled, cq.len(), cq.isArmed())
		}
		if got := ctx.Stats().MissedEventRepolls; got != 0 {
			// EndBusyPoll schedules instead of re-polling itself.
			t.Fatalf("MissedEventRepolls %d", got)
		}
	})
}

// TestEndBusyPollWhilePollRunning: a busy poller that finds the goroutine
// polling returns at once, and an EndBusyPoll that cannot take the lock
// makes one more poll happen, which arms the CQ, whichever order the
// running poll read the busy flag in.
func TestEndBusyPollWhilePollRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(8)
		entered := make(chan struct{}, 1)
		release := make(chan struct{})
		handled := 0
		ctx, err := New(Config{Name: "contended", CQ: cq, Handle: func(wcs []hca.WC) {
			handled += len(wcs)
			if handled == 1 {
				entered <- struct{}{}
				<-release
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		ctx.Start()
		defer ctx.Stop()
		must(t, cq.add(recvWC(1)))
		<-entered
		if n := ctx.BusyPoll(); n != 0 {
			t.Fatalf("BusyPoll during a poll returned %d", n)
		}
		ctx.EndBusyPoll()
		close(release)
		synctest.Wait()
		st := ctx.Stats()
		if st.BusyPollsContended != 1 || st.BusyPollEnds != 1 || !cq.isArmed() {
			t.Fatalf("contended %d ends %d armed %v; want 1, 1, armed", st.BusyPollsContended, st.BusyPollEnds, cq.isArmed())
		}
		must(t, cq.add(recvWC(2)))
		synctest.Wait()
		if handled != 2 {
			t.Fatalf("handled %d, want 2: the completion after EndBusyPoll was lost", handled)
		}
	})
}

// TestBusyPollOnlyWhileRunning: before Start and after Stop BusyPoll never
// calls Handle, and Stop waits for a Handle that is running, a BusyPoll's
// (Stop must wait for the poll lock) or the goroutine's (Stop waits for the
// goroutine). Each subtest arranges which poller is in Handle instead of
// racing them. Not in a synctest bubble: a goroutine waiting on the poll
// lock (a mutex) is not durably blocked.
func TestBusyPollOnlyWhileRunning(t *testing.T) {
	for _, byBusyPoll := range []bool{true, false} {
		name := "goroutine in Handle"
		if byBusyPoll {
			name = "BusyPoll in Handle"
		}
		t.Run(name, func(t *testing.T) {
			cq := newFakeCQ(8)
			inHandle := make(chan struct{})
			release := make(chan struct{})
			var calls atomic.Int32
			var handleReturned atomic.Bool
			ctx, err := New(Config{Name: "life", CQ: cq, Handle: func([]hca.WC) {
				if calls.Add(1) == 1 {
					close(inHandle)
					<-release
					handleReturned.Store(true)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			cq.onCompletion = ctx.Schedule
			if byBusyPoll {
				// No completion event: nothing wakes the goroutine, so
				// only the BusyPoll below can poll.
				cq.onCompletion = func() {}
			}
			must(t, cq.add(recvWC(1)))
			if n := ctx.BusyPoll(); n != 0 || calls.Load() != 0 {
				t.Fatalf("BusyPoll before Start handled %d", n)
			}
			busyDone := make(chan struct{})
			if byBusyPoll {
				// Start would find the queued completion and schedule the
				// goroutine: take it out, start, and queue it again.
				if n := cq.Poll(make([]hca.WC, 8)); n != 1 {
					t.Fatalf("fake CQ held %d completions, want 1", n)
				}
				ctx.Start()
				must(t, cq.add(recvWC(2)))
				go func() { defer close(busyDone); ctx.BusyPoll() }()
			} else {
				close(busyDone)
				ctx.Start() // schedules the goroutine for the queued completion
			}
			waitFor(t, inHandle, "Handle to start")
			if st := ctx.Stats(); byBusyPoll && (st.BusyPolls != 1 || st.Wakeups != 0) ||
				!byBusyPoll && (st.BusyPolls != 0 || st.Wakeups != 1) {
				t.Fatalf("busy polls %d, wake-ups %d: the wrong poller is in Handle", st.BusyPolls, st.Wakeups)
			}
			stopped := make(chan bool)
			go func() { ctx.Stop(); stopped <- handleReturned.Load() }()
			// Stop sets the state and closes ctx.stop, under the life
			// lock, before it waits; from then on it must wait. The
			// closed channel is the event.
			waitFor(t, ctx.stop, "Stop to mark the context stopped")
			if s := ctx.State(); s != StateStopped {
				t.Fatalf("state %v after Stop closed its stop channel, want %v", s, StateStopped)
			}
			if byBusyPoll {
				// The goroutine is not in Handle, so it exits; from then
				// on only the poll lock keeps Stop from returning.
				waitFor(t, ctx.exited, "the poll goroutine to exit")
			}
			// Stop must still be waiting. That it is cannot be observed,
			// only that it returned: give a wrong Stop a bounded window to
			// return early. A correct Stop never does, so the window can
			// only miss the bug (on a slow machine), never flag a good one.
			select {
			case <-stopped:
				t.Fatal("Stop returned while Handle was running")
			case <-time.After(20 * time.Millisecond):
			}
			close(release)
			if !<-stopped {
				t.Fatal("Stop returned while Handle was running")
			}
			waitFor(t, busyDone, "BusyPoll to return")
			must(t, cq.add(recvWC(3)))
			if n := ctx.BusyPoll(); n != 0 || calls.Load() != 1 {
				t.Fatalf("BusyPoll after Stop handled %d (Handle calls %d)", n, calls.Load())
			}
		})
	}
}

// TestBusyPollStress races a producer that busy-polls after each burst and
// gives re-arming back now and then against the poll goroutine: every
// completion is handled exactly once and none is left behind.
func TestBusyPollStress(t *testing.T) {
	const total = 20000
	cq := newFakeCQ(1024)
	var handled atomic.Int64
	seen := make([]atomic.Bool, total)
	allDone := make(chan struct{})
	var dup atomic.Int64
	ctx, err := New(Config{Name: "stress", CQ: cq, Budget: 32, Batch: 8, Handle: func(wcs []hca.WC) {
		for _, wc := range wcs {
			if seen[wc.ID].Swap(true) {
				dup.Add(1)
			}
		}
		if handled.Add(int64(len(wcs))) == total {
			close(allDone)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	cq.onCompletion = ctx.Schedule
	ctx.Start()
	defer ctx.Stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		id := uint64(0)
		for burst := 0; id < total; burst++ {
			for k := 0; k < 1+burst%7 && id < total; k++ {
				for cq.add(recvWC(id)) != nil {
					ctx.BusyPoll() // full: reap
				}
				id++
			}
			ctx.BusyPoll()
			if burst%5 == 0 {
				ctx.EndBusyPoll() // "about to block with work outstanding"
			}
		}
		ctx.EndBusyPoll()
	}()
	wg.Wait()
	waitFor(t, allDone, "every completion handled")
	if dup.Load() != 0 || cq.len() != 0 {
		t.Fatalf("duplicates %d, left in CQ %d", dup.Load(), cq.len())
	}
	// Handle's last call closed allDone before its poller counted the
	// batch; Stop waits for every poller to return.
	ctx.Stop()
	st := ctx.Stats()
	if st.BusyPolls == 0 || st.Completions != total {
		t.Fatalf("busy polls %d completions %d", st.BusyPolls, st.Completions)
	}
	t.Logf("wakeups %d busy polls %d contended %d left unarmed %d ends %d", st.Wakeups, st.BusyPolls, st.BusyPollsContended, st.LeftUnarmed, st.BusyPollEnds)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
