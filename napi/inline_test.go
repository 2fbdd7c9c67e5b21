package napi

import (
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// inlineRig is a Context with Config.Inline on a fake CQ whose completion
// event schedules it, and a Handle that records what it got, whether the
// poll was inline, and defers completions deferID names while inline.
type inlineRig struct {
	cq      *fakeCQ
	ctx     *Context
	got     chan handled
	deferID func(id uint64) bool
}

type handled struct {
	id     uint64
	inline bool
}

func newInlineRig(t *testing.T) *inlineRig {
	t.Helper()
	r := &inlineRig{cq: newFakeCQ(64), got: make(chan handled, 64), deferID: func(uint64) bool { return false }}
	ctx, err := New(Config{Name: "inline", CQ: r.cq, Inline: true, Handle: func(wcs []hca.WC) {
		for k, wc := range wcs {
			if r.ctx.Inline() && r.deferID(wc.ID) {
				r.ctx.Defer(wcs[k:])
				return
			}
			r.got <- handled{wc.ID, r.ctx.Inline()}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.ctx = ctx
	r.cq.onCompletion = ctx.Schedule
	ctx.Start()
	t.Cleanup(ctx.Stop)
	return r
}

// next waits for the next handled completion.
func (r *inlineRig) next(t *testing.T) handled {
	t.Helper()
	select {
	case h := <-r.got:
		return h
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing handled; stats %+v", r.ctx.Stats())
		return handled{}
	}
}

// TestInlinePollOnCaller: a completion event on an idle Context polls on
// the goroutine that raised it: Handle has run when the post returns, the
// poll goroutine was never woken, and the CQ is armed again.
func TestInlinePollOnCaller(t *testing.T) {
	r := newInlineRig(t)
	for id := range uint64(3) {
		if err := r.cq.add(recvWC(id)); err != nil {
			t.Fatal(err)
		}
		select {
		case h := <-r.got:
			if h.id != id || !h.inline {
				t.Fatalf("handled %+v, want id %d inline", h, id)
			}
		default:
			t.Fatalf("completion %d not handled by the time its event returned", id)
		}
	}
	st := r.ctx.Stats()
	if st.InlinePolls != 3 || st.Wakeups != 0 || st.Completions != 3 || !r.cq.isArmed() {
		t.Fatalf("stats %+v, armed %v: want 3 inline polls, no wake-up", st, r.cq.isArmed())
	}
}

// TestInlineDefer: what an inline Handle defers is handled by the poll
// goroutine, before anything newer and once; the next event polls inline
// again.
func TestInlineDefer(t *testing.T) {
	r := newInlineRig(t)
	r.deferID = func(id uint64) bool { return id == 1 || id == 4 }
	if err := r.cq.add(recvWC(0), recvWC(1), recvWC(2)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []handled{{0, true}, {1, false}, {2, false}} {
		if h := r.next(t); h != want {
			t.Fatalf("handled %+v, want %+v", h, want)
		}
	}
	// The goroutine may still be in the poll that handled 2 (re-arming):
	// an event then does not poll inline. Sync returns once that poll
	// is over.
	r.ctx.Sync(func() {})
	if err := r.cq.add(recvWC(3)); err != nil {
		t.Fatal(err)
	}
	if h := r.next(t); h != (handled{3, true}) {
		t.Fatalf("after the deferred work: %+v, want 3 inline", h)
	}
	r.ctx.Sync(func() {})
	if err := r.cq.add(recvWC(4), recvWC(5)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []handled{{4, false}, {5, false}} {
		if h := r.next(t); h != want {
			t.Fatalf("handled %+v, want %+v", h, want)
		}
	}
	r.ctx.Sync(func() {}) // the poll that handled 5 has counted it
	st := r.ctx.Stats()
	if st.Deferred != 4 || st.Completions != 6 {
		t.Fatalf("stats %+v: want 4 deferred, 6 completions", st)
	}
}

// TestInlineNotWhilePolling: an event while the poll lock is held (a poll
// or a Sync running) does not poll inline; the poll goroutine picks the
// completion up once the lock is free.
func TestInlineNotWhilePolling(t *testing.T) {
	r := newInlineRig(t)
	r.ctx.Sync(func() {
		if err := r.cq.add(recvWC(7)); err != nil {
			t.Fatal(err)
		}
	})
	if h := r.next(t); h != (handled{7, false}) {
		t.Fatalf("handled %+v, want 7 by the poll goroutine", h)
	}
	if st := r.ctx.Stats(); st.InlinePolls != 0 || st.Wakeups == 0 {
		t.Fatalf("stats %+v: want the goroutine woken, no inline poll", st)
	}
}

// TestStopHandlesDeferred: completions an inline poll deferred are
// handled once each even when Stop comes before the poll goroutine got to
// them (Stop hands them to Handle itself), and counted as completions:
// polled off the CQ, nothing else would ever see them. Each round races
// Stop against the goroutine's wake-up; every interleaving must end with
// every completion handled exactly once.
func TestStopHandlesDeferred(t *testing.T) {
	for round := range 200 {
		cq := newFakeCQ(8)
		var ctx *Context
		seen := map[uint64]int{}
		var mu sync.Mutex
		ctx, err := New(Config{Name: "stop", CQ: cq, Inline: true, Handle: func(wcs []hca.WC) {
			if ctx.Inline() && len(wcs) > 1 {
				// Handle the first here, defer the rest (their
				// handling needs a lock the poster holds).
				ctx.Defer(wcs[1:])
				wcs = wcs[:1]
			}
			mu.Lock()
			for _, wc := range wcs {
				seen[wc.ID]++
			}
			mu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		cq.onCompletion = ctx.Schedule
		ctx.Start()
		if err := cq.add(recvWC(0), recvWC(1), recvWC(2), recvWC(3)); err != nil {
			t.Fatal(err)
		}
		ctx.Stop()
		mu.Lock()
		for id := range uint64(4) {
			if seen[id] != 1 {
				t.Fatalf("round %d: completion %d handled %d times (all: %v; stats %+v)", round, id, seen[id], seen, ctx.Stats())
			}
		}
		mu.Unlock()
		if st := ctx.Stats(); st.Completions != 4 || st.Deferred != 3 || st.InlinePolls != 1 {
			t.Fatalf("round %d: stats %+v: want 4 completions, 3 deferred, 1 inline poll", round, st)
		}
	}
}
