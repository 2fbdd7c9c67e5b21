package napi

import (
	"testing"
	"testing/synctest"

	"github.com/ipoibcm/ipoib/hca"
)

// TestRearmReportsMissedCompletions shows that the re-arm contract is what
// keeps completions from being lost: with a CQ whose Notify ignores
// reportMissed, a completion that lands between the poller's last Poll and its
// re-arm stays in the CQ with no event to fetch it. synctest.Wait makes
// "the poller went to sleep" exact instead of timed.
func TestRearmReportsMissedCompletions(t *testing.T) {
	for _, tc := range []struct {
		name               string
		ignoreReportMissed bool
		wantHandled        int
		wantStuck          int
		wantRepolls        uint64
	}{
		{name: "contract kept", wantHandled: 2, wantStuck: 0, wantRepolls: 1},
		{name: "reportMissed ignored", ignoreReportMissed: true, wantHandled: 1, wantStuck: 1, wantRepolls: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cq := newFakeCQ(8)
				cq.ignoreReportMissed = tc.ignoreReportMissed
				handled := 0
				ctx, err := New(Config{Name: "rearm", CQ: cq, Handle: func(wcs []hca.WC) { handled += len(wcs) }})
				if err != nil {
					t.Fatal(err)
				}
				cq.onCompletion = ctx.Schedule
				injected := false
				cq.onDrained = func(n int) {
					if n == 0 || injected {
						return
					}
					// The CQ is unarmed (the event for the first
					// completion consumed the arm): no event.
					injected = true
					if err := cq.add(recvWC(2)); err != nil {
						t.Error(err)
					}
				}
				ctx.Start()
				defer ctx.Stop()
				if err := cq.add(recvWC(1)); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()

				if !injected {
					t.Fatal("the drained-CQ race was not staged")
				}
				if handled != tc.wantHandled {
					t.Errorf("handled %d, want %d", handled, tc.wantHandled)
				}
				if got := cq.len(); got != tc.wantStuck {
					t.Errorf("%d completions left in the CQ, want %d", got, tc.wantStuck)
				}
				if got := ctx.Stats().MissedEventRepolls; got != tc.wantRepolls {
					t.Errorf("MissedEventRepolls %d, want %d", got, tc.wantRepolls)
				}
				if !cq.isArmed() {
					t.Error("CQ left unarmed after the poller went idle")
				}
			})
		})
	}
}

// TestStartReportsCompletionsQueuedBeforeStart: completions queued before
// Start never raise an event (the CQ was not armed), so Start's arm must
// report them and schedule a poll.
func TestStartReportsCompletionsQueuedBeforeStart(t *testing.T) {
	for _, tc := range []struct {
		name               string
		ignoreReportMissed bool
		wantHandled        int
	}{
		{name: "contract kept", wantHandled: 3},
		{name: "reportMissed ignored", ignoreReportMissed: true, wantHandled: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cq := newFakeCQ(8)
				cq.ignoreReportMissed = tc.ignoreReportMissed
				handled := 0
				ctx, err := New(Config{Name: "start", CQ: cq, Handle: func(wcs []hca.WC) { handled += len(wcs) }})
				if err != nil {
					t.Fatal(err)
				}
				cq.onCompletion = ctx.Schedule
				if err := cq.add(recvWC(1), recvWC(2), recvWC(3)); err != nil {
					t.Fatal(err)
				}
				ctx.Start()
				defer ctx.Stop()
				synctest.Wait()
				if handled != tc.wantHandled {
					t.Errorf("handled %d, want %d", handled, tc.wantHandled)
				}
				if got, want := cq.len(), 3-tc.wantHandled; got != want {
					t.Errorf("%d left in CQ, want %d", got, want)
				}
			})
		})
	}
}
