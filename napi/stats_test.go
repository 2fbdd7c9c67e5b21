package napi

import (
	"slices"
	"testing"
	"testing/synctest"

	"github.com/ipoibcm/ipoib/hca"
)

// TestStatsAndBatching walks one Context through budget exhaustion, an event
// and a spurious wake-up, checking every counter and every Poll size.
func TestStatsAndBatching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(16)
		cq.recordPolls = true
		var batches []int
		ctx, err := New(Config{Name: "stats", CQ: cq, Budget: 4, Batch: 3, Handle: func(wcs []hca.WC) {
			batches = append(batches, len(wcs))
		}})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		for id := range uint64(10) {
			if err := cq.add(recvWC(id)); err != nil {
				t.Fatal(err)
			}
		}
		ctx.Start()
		defer ctx.Stop()
		synctest.Wait()

		// Polls of min(3, 4-done): 3+1 (budget), 3+1 (budget), 3 asked
		// and 2 found (dry: no further Poll), then re-armed.
		if want := []int{3, 1, 3, 1, 3}; !slices.Equal(cq.polls(), want) {
			t.Errorf("Poll sizes %v, want %v", cq.polls(), want)
		}
		if want := []int{3, 1, 3, 1, 2}; !slices.Equal(batches, want) {
			t.Errorf("Handle batches %v, want %v", batches, want)
		}
		want := Stats{Polls: 3, Completions: 10, BudgetExhausted: 2, Wakeups: 1, Rearms: 2, MaxPerPoll: 4}
		if got := ctx.Stats(); got != want {
			t.Errorf("stats after backlog\n got %+v\nwant %+v", got, want)
		}
		if got, want := ctx.Stats().AvgPerPoll(), 10.0/3; got != want {
			t.Errorf("AvgPerPoll %v, want %v", got, want)
		}

		// One completion on the armed CQ: one event, one poll.
		if err := cq.add(recvWC(10)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		want = Stats{Polls: 4, Completions: 11, BudgetExhausted: 2, Wakeups: 2, Rearms: 3, MaxPerPoll: 4}
		if got := ctx.Stats(); got != want {
			t.Errorf("stats after event\n got %+v\nwant %+v", got, want)
		}

		// A spurious wake-up polls nothing and re-arms.
		ctx.Schedule()
		synctest.Wait()
		want = Stats{Polls: 5, Completions: 11, BudgetExhausted: 2, Wakeups: 3, Rearms: 4, MaxPerPoll: 4}
		if got := ctx.Stats(); got != want {
			t.Errorf("stats after spurious wake-up\n got %+v\nwant %+v", got, want)
		}
		if got := cq.events.Load(); got != 1 {
			t.Errorf("CQ raised %d events, want 1", got)
		}
	})
}

// TestScheduleCoalesces: a burst of Schedule calls before the goroutine
// runs causes one wake-up.
func TestScheduleCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, err := New(Config{CQ: newFakeCQ(4), Handle: func([]hca.WC) {}})
		if err != nil {
			t.Fatal(err)
		}
		for range 100 {
			ctx.Schedule()
		}
		ctx.Start()
		defer ctx.Stop()
		synctest.Wait()
		if st := ctx.Stats(); st.Wakeups != 1 || st.Polls != 1 {
			t.Errorf("100 Schedules gave %d wake-ups and %d polls, want 1 and 1", st.Wakeups, st.Polls)
		}
	})
}

func TestAvgPerPollZero(t *testing.T) {
	if got := (Stats{}).AvgPerPoll(); got != 0 {
		t.Errorf("AvgPerPoll of no polls = %v, want 0", got)
	}
}

// overReportingCQ claims more completions than it was asked for whenever
// it has any, as a buggy backend might; the budget must still hold.
type overReportingCQ struct{ fakeCQ }

func (s *overReportingCQ) Poll(into []hca.WC) int {
	if n := s.fakeCQ.Poll(into); n > 0 {
		return n + 5
	}
	return 0
}

func TestBudgetHoldsAgainstOverReportingCQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := &overReportingCQ{fakeCQ: *newFakeCQ(16)}
		var batches []int
		ctx, err := New(Config{CQ: cq, Budget: 4, Batch: 2, Handle: func(wcs []hca.WC) { batches = append(batches, len(wcs)) }})
		if err != nil {
			t.Fatal(err)
		}
		if err := cq.add(recvWC(1), recvWC(2), recvWC(3)); err != nil {
			t.Fatal(err)
		}
		ctx.Start()
		synctest.Wait()
		ctx.Stop()
		if st := ctx.Stats(); st.MaxPerPoll > 4 {
			t.Errorf("MaxPerPoll %d over budget 4", st.MaxPerPoll)
		}
		for _, b := range batches {
			if b > 2 {
				t.Fatalf("batch of %d over Batch 2: %v", b, batches)
			}
		}
	})
}
