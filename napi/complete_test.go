package napi

import (
	"slices"
	"testing"
	"testing/synctest"

	"github.com/ipoibcm/ipoib/hca"
)

// TestCompleteAfterPollUnderBudget: Complete follows the Handle calls of a
// poll that ended under its budget, never those of a poll that used it
// all (napi_complete_done is not called then), also when the poll after
// an exhausted one finds the CQ empty; and Stop calls it once more.
func TestCompleteAfterPollUnderBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cq := newFakeCQ(16)
		var log []int // a Handle's batch size, 0 for Complete
		ctx, err := New(Config{Name: "complete", CQ: cq, Budget: 4, Batch: 4,
			Handle:   func(wcs []hca.WC) { log = append(log, len(wcs)) },
			Complete: func() { log = append(log, 0) },
		})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		for id := range uint64(8) {
			if err := cq.add(recvWC(id)); err != nil {
				t.Fatal(err)
			}
		}
		ctx.Start()
		synctest.Wait()
		// Two exhausted polls, then one that finds nothing: completed.
		if want := []int{4, 4, 0}; !slices.Equal(log, want) {
			t.Fatalf("after 8 completions, budget 4: %v, want %v", log, want)
		}
		log = log[:0]
		if err := cq.add(recvWC(8), recvWC(9)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if want := []int{2, 0}; !slices.Equal(log, want) {
			t.Fatalf("after 2 completions: %v, want %v", log, want)
		}
		log = log[:0]
		ctx.Stop()
		if want := []int{0}; !slices.Equal(log, want) {
			t.Fatalf("Stop: %v, want %v", log, want)
		}
	})
}
