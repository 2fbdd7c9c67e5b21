package soft

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// sendN posts n one-byte RC sends a -> b with IDs first..first+n-1.
func (r *rig) sendN(t *testing.T, first, n int) {
	t.Helper()
	wrs := make([]hca.SendWR, n)
	for i := range wrs {
		wrs[i] = hca.SendWR{ID: uint64(first + i), Data: []byte{byte(first + i)}}
	}
	got, err := r.a.PostSend(wrs)
	must(t, err)
	if got != n {
		t.Fatalf("posted %d of %d", got, n)
	}
}

// drainNow polls everything c holds now, without waiting.
func drainNow(c *cq) []hca.WC {
	var out []hca.WC
	buf := make([]hca.WC, 64)
	for k := c.Poll(buf); k > 0; k = c.Poll(buf) {
		out = append(out, buf[:k]...)
	}
	return out
}

func wantIDs(t *testing.T, what string, wcs []hca.WC, first, n int) {
	t.Helper()
	if len(wcs) != n {
		t.Fatalf("%s: %d completions, want %d", what, len(wcs), n)
	}
	for i, wc := range wcs {
		if wc.ID != uint64(first+i) || wc.Status != hca.StatusSuccess || wc.Context != "a" {
			t.Fatalf("%s: completion %d is %+v, want ID %d, success, context a", what, i, wc, first+i)
		}
	}
}

// TestHoldCompletions: a held CQ shows nothing and raises no event while
// the sends it belongs to are delivered; Pass lets the oldest in, in
// order, with a completion event, and keeps the rest held; Release lets
// the rest in; the peer's CQ is not held. The CQs' events are inline, so
// "no event" and "an event" are facts by the time the verb returns.
func TestHoldCompletions(t *testing.T) {
	const n, passed = 20, 5
	r := newRig(t, Config{Seed: 3}, rigOpts{inline: true})
	r.postRecvs(t, n, 8)
	h, err := r.f.HoldCompletions(r.acq)
	must(t, err)
	if r.acq.Notify(true) {
		t.Fatal("empty CQ reported completions")
	}
	r.sendN(t, 0, n)
	if got := drainNow(r.acq); len(got) != 0 {
		t.Fatalf("held CQ polled %d completions: %+v", len(got), got)
	}
	noEvent := func(when string) {
		t.Helper()
		select {
		case <-r.wake:
			t.Fatalf("completion event %s", when)
		default:
		}
	}
	noEvent("for a held CQ")
	if st := r.f.Stats(); st.PendingCompletion != n || st.DelayedCompletions != 0 || st.RCMessages != n {
		t.Fatalf("pending %d delayed %d delivered %d; want %d, 0, %d", st.PendingCompletion, st.DelayedCompletions, st.RCMessages, n, n)
	}
	// The receiver's CQ is not held: its completions are there already
	// (it was never armed, so it raised no event either).
	if got := drainNow(r.bcq); len(got) != n {
		t.Fatalf("receiver CQ has %d completions, want %d", len(got), n)
	}

	if got := h.Pass(passed); got != passed {
		t.Fatalf("Pass(%d) let %d in", passed, got)
	}
	select {
	case <-r.wake: // the armed CQ's event, raised by Pass
	default:
		t.Fatal("Pass raised no completion event on the armed CQ")
	}
	wantIDs(t, "passed", drainNow(r.acq), 0, passed)
	if st := r.f.Stats(); st.PendingCompletion != n-passed {
		t.Fatalf("pending %d after Pass, want %d", st.PendingCompletion, n-passed)
	}
	if r.acq.Notify(true) {
		t.Fatal("CQ reported completions after Pass's were polled")
	}
	if got := h.Pass(0); got != 0 {
		t.Fatalf("Pass(0) let %d in", got)
	}
	noEvent("for Pass(0)")

	h.Release()
	select {
	case <-r.wake:
	default:
		t.Fatal("Release raised no completion event on the armed CQ")
	}
	wantIDs(t, "after release", drainNow(r.acq), passed, n-passed)
	if st := r.f.Stats(); st.PendingCompletion != 0 {
		t.Fatalf("pending %d after release", st.PendingCompletion)
	}
	h.Release() // idempotent: nothing more, and no panic
	if got := h.Pass(1); got != 0 {
		t.Fatalf("Pass after Release let %d in", got)
	}

	// Completions after the release flow straight in again.
	r.postRecvs(t, 1, 8)
	r.sendN(t, n, 1)
	wantIDs(t, "after the hold", drainNow(r.acq), n, 1)

	// A CQ can be held again once released; Pass lets in at most what is
	// held.
	h, err = r.f.HoldCompletions(r.acq)
	must(t, err)
	r.postRecvs(t, 1, 8)
	r.sendN(t, n+1, 1)
	if got := drainNow(r.acq); len(got) != 0 {
		t.Fatalf("second hold leaked %d completions", len(got))
	}
	if got := h.Pass(10); got != 1 {
		t.Fatalf("Pass(10) with one held let %d in", got)
	}
	wantIDs(t, "second hold", drainNow(r.acq), n+1, 1)
	h.Release()
}

// TestHoldCompletionsErrors: foreign, destroyed and already held CQs are
// refused with the contract's errors, and a release after the CQ is gone
// does nothing.
func TestHoldCompletionsErrors(t *testing.T) {
	r := newRig(t, Config{}, rigOpts{})
	other := NewFabric(Config{})
	t.Cleanup(func() { other.Close() })
	if _, err := other.HoldCompletions(r.acq); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("CQ of another fabric: %v, want ErrInvalidArgument", err)
	}
	if _, err := r.f.HoldCompletions(nil); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("nil CQ: %v, want ErrInvalidArgument", err)
	}
	h, err := r.f.HoldCompletions(r.bcq)
	must(t, err)
	if _, err := r.f.HoldCompletions(r.bcq); !errors.Is(err, hca.ErrBusy) {
		t.Fatalf("held twice: %v, want ErrBusy", err)
	}
	r.postRecvs(t, 1, 8)
	r.sendN(t, 0, 1)
	if st := r.f.Stats(); st.PendingCompletion != 1 {
		t.Fatalf("pending %d, want the receive held", st.PendingCompletion)
	}
	must(t, r.b.Destroy())
	must(t, r.bcq.Destroy())
	if st := r.f.Stats(); st.PendingCompletion != 0 {
		t.Fatalf("pending %d after the held CQ was destroyed", st.PendingCompletion)
	}
	if got := h.Pass(1); got != 0 {
		t.Fatalf("Pass on a destroyed CQ let %d in", got)
	}
	h.Release()
	if _, err := r.f.HoldCompletions(r.bcq); !errors.Is(err, hca.ErrDestroyed) {
		t.Fatalf("destroyed CQ: %v, want ErrDestroyed", err)
	}
}

// TestHoldCompletionsBehindDelay: completions Faults.CompletionDelay held
// before the hold do not enter the ring while it is on, and after release
// they still wait for their due time, with the held ones behind them: the
// CQ's order survives both.
func TestHoldCompletionsBehindDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delayed, held = 8, 8
		const maxDelay = 10 * time.Millisecond
		r := newRig(t, Config{Seed: 5, Faults: Faults{CompletionDelay: CompletionDelay{Probability: 1, Max: maxDelay}}}, rigOpts{})
		r.postRecvs(t, delayed+held, 8)
		r.sendN(t, 0, delayed)
		h, err := r.f.HoldCompletions(r.acq)
		must(t, err)
		r.sendN(t, delayed, held)
		time.Sleep(2 * maxDelay) // every delay is due; the hold is not over
		synctest.Wait()
		if got := drainNow(r.acq); len(got) != 0 {
			t.Fatalf("%d completions entered a held CQ when their delay ran out", len(got))
		}
		h.Release()
		wantIDs(t, "released after the delays", drainNow(r.acq), 0, delayed+held)

		// Now Pass and Release before the delays ahead are due: only what
		// is due gets in, and the rest follows at its time, in order.
		r.postRecvs(t, delayed+held, 8)
		r.sendN(t, 100, delayed)
		h, err = r.f.HoldCompletions(r.acq)
		must(t, err)
		r.sendN(t, 100+delayed, held)
		early := h.Pass(delayed + held)
		if early >= delayed {
			t.Fatalf("Pass let %d in before the delays ran out (seeded: some are due later)", early)
		}
		got := drainNow(r.acq)
		h.Release()
		got = append(got, drainNow(r.acq)...)
		if len(got) >= delayed+held {
			t.Fatalf("%d completions in before the delay ahead of them ran out", len(got))
		}
		time.Sleep(2 * maxDelay)
		synctest.Wait()
		wantIDs(t, "released behind the delays", append(got, drainNow(r.acq)...), 100, delayed+held)
		if st := r.f.Stats(); st.PendingCompletion != 0 {
			t.Fatalf("pending %d at the end", st.PendingCompletion)
		}
		r.f.Close()
	})
}
