package napi

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// stressHandler records what a Context under stress handled. Its fields are
// written only from Handle (the poll goroutine) and read after Stop, which
// orders them.
type stressHandler struct {
	ctx       *Context
	batch     int
	seen      []uint32 // times each completion id was handled
	perPoll   map[uint64]int
	oversized int // batches longer than Batch
	inline    int // batches handed over by inline polls
	handled   atomic.Uint64
	progress  chan struct{} // pinged after each batch; waiters re-check handled
	// inFlight bounds the producers' completions not yet handled, so the
	// poller keeps catching up and draining the CQ, which is when the
	// interesting races happen. Producers take a token per completion,
	// Handle returns it.
	inFlight    chan struct{}
	producerIDs [2]uint64 // [first, end) of the ids that hold a token
}

func (h *stressHandler) handle(wcs []hca.WC) {
	if len(wcs) > h.batch {
		h.oversized++
	}
	if h.ctx.Inline() {
		h.inline++
		// An inline poll hands back every completion from the first id
		// divisible by 5 on, as a Handle that cannot take a lock would.
		for k, wc := range wcs {
			if wc.ID%5 == 0 {
				h.ctx.Defer(wcs[k:])
				wcs = wcs[:k]
				break
			}
		}
	}
	// Polls is counted when a poll begins, so it names the current poll.
	h.perPoll[h.ctx.Stats().Polls] += len(wcs)
	for _, wc := range wcs {
		if wc.ID < uint64(len(h.seen)) {
			h.seen[wc.ID]++
		}
		if wc.ID >= h.producerIDs[0] && wc.ID < h.producerIDs[1] {
			<-h.inFlight
		}
	}
	h.handled.Add(uint64(len(wcs)))
	select {
	case h.progress <- struct{}{}:
	default:
	}
}

// TestStressEveryCompletionHandledOnce races producers, completion events,
// spurious events and completions landing between a poll and its re-arm
// against one Context, then checks nothing was lost or duplicated and no poll
// went over budget.
//
// The inline case runs the same with Config.Inline: producers' completion
// events poll on the producers' goroutines, and those polls defer part of
// what they get to the poll goroutine.
func TestStressEveryCompletionHandledOnce(t *testing.T) {
	for _, inline := range []bool{false, true} {
		t.Run(map[bool]string{false: "goroutine", true: "inline"}[inline], func(t *testing.T) { stressOnce(t, inline) })
	}
}

func stressOnce(t *testing.T, inline bool) {
	const (
		producers   = 4
		perProducer = 4000
		injectPool  = 500 // ids reserved for the drained-CQ race
		budget      = 10  // not a multiple of batch: min(Batch, Budget-done) matters
		batch       = 4
		prefill     = 3 * budget
		maxBurst    = 6
		// A producer holds tokens for a whole burst before posting it, so
		// the window must cover every producer's burst at once.
		window = producers * maxBurst
	)
	if testing.Short() {
		t.Skip("stress test skipped in -short mode")
	}
	total := prefill + producers*perProducer + injectPool
	cq := newFakeCQ(total)
	h := &stressHandler{
		batch:       batch,
		seen:        make([]uint32, total),
		perPoll:     make(map[uint64]int),
		progress:    make(chan struct{}, 1),
		inFlight:    make(chan struct{}, window),
		producerIDs: [2]uint64{prefill, prefill + producers*perProducer},
	}
	ctx, err := New(Config{Name: "stress", CQ: cq, Budget: budget, Batch: batch, Handle: h.handle, Inline: inline})
	if err != nil {
		t.Fatal(err)
	}
	h.ctx = ctx
	cq.onCompletion = ctx.Schedule

	// ids: [0, prefill) prefilled, then one range per producer, then the
	// injection pool.
	var posted atomic.Uint64
	for id := range uint64(prefill) {
		if err := cq.add(recvWC(id)); err != nil {
			t.Fatal(err)
		}
		posted.Add(1)
	}

	// Completions that land right after the poller drained the CQ and
	// before it re-arms: the CQ is unarmed, so no event; only the re-arm's
	// missed-event report can find them.
	var injectMu sync.Mutex
	injectOpen := true
	nextInject := uint64(prefill + producers*perProducer)
	var drains int
	cq.onDrained = func(int) {
		injectMu.Lock()
		defer injectMu.Unlock()
		drains++
		if !injectOpen || drains%3 != 0 || nextInject == uint64(total) {
			return
		}
		if err := cq.add(recvWC(nextInject)); err != nil {
			panic(err) // capacity covers every id
		}
		nextInject++
		posted.Add(1)
	}

	ctx.Start() // prefill exceeds the budget: Start's re-arm must report it

	stopSpurious := make(chan struct{})
	firstSpurious := make(chan struct{})
	var spurious atomic.Uint64
	var spuriousWG sync.WaitGroup
	spuriousWG.Add(1)
	go func() {
		defer spuriousWG.Done()
		r := rand.New(rand.NewPCG(1, 2))
		for n := 0; ; n++ {
			select {
			case <-stopSpurious:
				return
			default:
			}
			if n == 0 || r.IntN(4) == 0 {
				ctx.Schedule() // an event with nothing behind it
				if spurious.Add(1) == 1 {
					close(firstSpurious)
				}
			}
			// Pace, not synchronise: a random pause of a few microseconds
			// lands the events at varied points of the poll loop without
			// keeping a core of a loaded 2-core machine spinning.
			time.Sleep(time.Duration(1+r.IntN(20)) * time.Microsecond)
		}
	}()
	<-firstSpurious // the spurious path runs at least once, whatever the scheduling

	var producerWG sync.WaitGroup
	for p := range producers {
		producerWG.Add(1)
		go func() {
			defer producerWG.Done()
			r := rand.New(rand.NewPCG(uint64(p), 99))
			base := uint64(prefill + p*perProducer)
			wcs := make([]hca.WC, 0, maxBurst)
			for i := 0; i < perProducer; {
				wcs = wcs[:0]
				for k := r.IntN(maxBurst) + 1; k > 0 && i < perProducer; k-- {
					h.inFlight <- struct{}{}
					wcs = append(wcs, recvWC(base+uint64(i)))
					i++
				}
				if err := cq.add(wcs...); err != nil {
					panic(err)
				}
				posted.Add(uint64(len(wcs)))
			}
		}()
	}
	producerWG.Wait()
	injectMu.Lock()
	injectOpen = false
	want := posted.Load()
	injectMu.Unlock()

	// Event-driven wait; the timer only turns a lost wake-up into a failure
	// instead of a hang.
	guard := time.NewTimer(30 * time.Second)
	defer guard.Stop()
	for h.handled.Load() < want {
		select {
		case <-h.progress:
		case <-guard.C:
			t.Fatalf("lost wake-up: handled %d of %d, %d left in CQ, armed=%v, stats %+v",
				h.handled.Load(), want, cq.len(), cq.isArmed(), ctx.Stats())
		}
	}
	close(stopSpurious)
	spuriousWG.Wait()
	ctx.Stop()

	st := ctx.Stats()
	if got := h.handled.Load(); got != want {
		t.Errorf("handled %d completions, posted %d", got, want)
	}
	for id := range nextInject {
		if h.seen[id] != 1 {
			t.Fatalf("completion %d handled %d times, want 1", id, h.seen[id])
		}
	}
	if h.oversized != 0 {
		t.Errorf("%d batches longer than Batch %d", h.oversized, batch)
	}
	maxSeen := 0
	for poll, n := range h.perPoll {
		if n > budget {
			t.Errorf("poll %d handled %d completions, budget %d", poll, n, budget)
		}
		maxSeen = max(maxSeen, n)
	}
	if st.MaxPerPoll != maxSeen || st.MaxPerPoll != budget {
		t.Errorf("MaxPerPoll %d, handler saw %d, want budget %d", st.MaxPerPoll, maxSeen, budget)
	}
	if st.Completions != want {
		t.Errorf("Stats.Completions %d, want %d", st.Completions, want)
	}
	// The races the test exists for must actually have happened.
	if st.MissedEventRepolls == 0 {
		t.Errorf("missed-event path never exercised: %+v", st)
	}
	if st.BudgetExhausted == 0 {
		t.Errorf("budget never exhausted: %+v", st)
	}
	if nextInject == uint64(prefill+producers*perProducer) {
		t.Errorf("no completion injected between poll and re-arm")
	}
	if inline && (st.InlinePolls == 0 || st.Deferred == 0 || h.inline == 0) {
		t.Errorf("inline polls %d (%d batches), deferred %d: the inline path never ran", st.InlinePolls, h.inline, st.Deferred)
	}
	if !inline && (st.InlinePolls != 0 || h.inline != 0) {
		t.Errorf("inline polls without Config.Inline: %+v", st)
	}
	t.Logf("posted %d (injected %d), events %d, spurious %d, stats %+v, avg/poll %.2f",
		want, nextInject-uint64(prefill+producers*perProducer), cq.events.Load(), spurious.Load(), st, st.AvgPerPoll())
}
