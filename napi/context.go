package napi

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
)

// Context polls one CQ from one goroutine. See the package documentation.
type Context struct {
	cfg Config

	// pollMu is the poll lock: held for a whole poll, taken by Sync.
	pollMu sync.Mutex
	// wcs is the poll buffer, reused for every batch.
	wcs []hca.WC
	// inline is true while Schedule runs a poll on its caller's
	// goroutine; deferred holds the completions that poll's Handle handed
	// back (Defer), for the poll goroutine to handle first. Both under
	// pollMu.
	inline   bool
	deferred []hca.WC

	// kick holds at most one pending wake-up, which is what coalesces a
	// burst of Schedule calls into one poll.
	kick chan struct{}
	// stop is closed by Stop; exited is closed when the goroutine is gone
	// (or by Stop if it never started).
	stop   chan struct{}
	exited chan struct{}
	// stopping mirrors stop for the poll loop, which checks it between
	// batches without a select.
	stopping atomic.Bool
	// running is true between Start and Stop, for BusyPoll, which must not
	// take lifeMu on the data path.
	running atomic.Bool
	// busy says a busy poller owns re-arming (see BusyPoll): the poll
	// goroutine's polls then end without arming the CQ.
	busy atomic.Bool

	lifeMu sync.Mutex // serialises Start and Stop
	state  State      // guarded by lifeMu

	counters counters
}

// New validates cfg and returns a Context in StateNew. Nothing runs until
// Start.
func New(cfg Config) (*Context, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Context{
		cfg: cfg,
		wcs: make([]hca.WC, cfg.Batch),
		// Defer takes at most the rest of one batch: the inline poll
		// stops there.
		deferred: make([]hca.WC, 0, cfg.Batch),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		exited:   make(chan struct{}),
	}, nil
}

// Name returns Config.Name.
func (c *Context) Name() string { return c.cfg.Name }

// State returns the lifecycle state.
func (c *Context) State() State {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	return c.state
}

// Start starts the poll goroutine and arms the CQ, scheduling a poll if
// completions are already queued (they would never raise an event). Start
// on a running or stopped Context does nothing.
func (c *Context) Start() {
	c.lifeMu.Lock()
	if c.state != StateNew {
		c.lifeMu.Unlock()
		return
	}
	c.state = StateRunning
	c.running.Store(true)
	go c.run()
	// Released before taking the poll lock: a Handle already running (from
	// a Schedule that came before Start) may call Stop, which takes lifeMu.
	c.lifeMu.Unlock()

	// Under the poll lock so the first arm never interleaves with a poll
	// started by a Schedule that came before Start.
	c.pollMu.Lock()
	c.counters.rearms.Add(1)
	missed := c.cfg.CQ.Notify(true)
	c.pollMu.Unlock()
	if missed {
		c.Schedule()
	}
}

// Schedule asks for a poll. It never blocks, coalesces with a poll already
// pending, is safe from any goroutine, before Start (the poll then runs once
// started) and after Stop (it does nothing). Wire it to
// hca.CQConfig.OnCompletion.
//
// With Config.Inline, Schedule runs the poll itself when no poll is
// running (it never waits for the poll lock): one poll, which re-arms the
// CQ as the goroutine's would. Whatever that poll leaves (the budget used
// up, completions that came during the re-arm, completions Handle
// deferred) goes to the poll goroutine as before.
func (c *Context) Schedule() {
	if c.cfg.Inline && c.running.Load() && c.pollMu.TryLock() {
		r := pollStopped
		// Not while deferred completions wait for the goroutine: they
		// come before anything newer.
		if !c.stopping.Load() && len(c.deferred) == 0 {
			c.inline = true
			c.counters.inlinePolls.Add(1)
			r = c.pollLocked()
			c.inline = false
		}
		idle := (r == pollArmed || r == pollLeftUnarmed) && len(c.deferred) == 0
		c.pollMu.Unlock()
		if idle {
			return
		}
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Inline reports whether the running poll is one Schedule runs on its
// caller's goroutine (Config.Inline). Call it only from Handle.
func (c *Context) Inline() bool { return c.inline }

// Defer hands wcs, the completions of the current batch that Handle has
// not handled, back to the Context: the poll goroutine hands them to
// Handle again, before anything newer, and the inline poll ends after
// this batch. Call it only from Handle during an inline poll, for
// completions whose handling needs a lock the poster may hold; Handle
// must have done nothing with them.
func (c *Context) Defer(wcs []hca.WC) {
	c.deferred = append(c.deferred, wcs...)
	c.counters.deferred.Add(uint64(len(wcs)))
}

// Sync runs fn under the poll lock: when fn runs, no poll that began before
// Sync was called is still running, and no poll starts until fn returns.
//
// Never call Sync from Handle (nor from anything Handle waits for): it
// waits for the poll that is calling it. A consumer keeps the rule by
// structure, not by checking at run time: the code that calls Sync runs on
// a goroutine of its own (ipoibcm's control loop), and Handle only hands
// work to it without waiting.
func (c *Context) Sync(fn func()) {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	fn()
}

// Stop stops the poll goroutine and waits for it to exit; once Stop returns,
// Handle is never called again. Stop is idempotent and safe from any
// goroutine but the poll's own: like Sync, never call it from Handle, which
// it would wait for.
//
// Completions an inline poll deferred that the goroutine had not handled
// yet are handed to Handle by Stop itself, on its caller's goroutine
// (Inline false), before it returns: they were polled off the CQ, so no
// later poll would see them, and a consumer that counts what it posted
// against what completed (a receive buffer reposted, a TX credit given
// back) must get each one. Handle may run there as on the goroutine: the
// caller of Stop already holds no lock Handle takes, or Stop would wait
// forever for the goroutine's Handle.
func (c *Context) Stop() {
	c.lifeMu.Lock()
	switch c.state {
	case StateNew:
		close(c.exited) // no goroutine will ever close it
		fallthrough
	case StateRunning:
		c.state = StateStopped
		c.running.Store(false)
		c.stopping.Store(true)
		close(c.stop)
	}
	c.lifeMu.Unlock()
	<-c.exited
	// A BusyPoll that took the lock before stopping was set may still be
	// in Handle; wait for it. Later ones see stopping under the lock, and
	// an inline poll sees running false, so deferred grows no more.
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	if n := len(c.deferred); n > 0 {
		c.cfg.Handle(c.deferred)
		clear(c.deferred)
		c.deferred = c.deferred[:0]
		c.counters.notePoll(n)
	}
	if c.cfg.Complete != nil {
		// The last poll may have used its whole budget.
		c.cfg.Complete()
	}
}

// Stats returns a snapshot of the counters.
func (c *Context) Stats() Stats { return c.counters.snapshot() }

// run is the poll goroutine.
func (c *Context) run() {
	defer close(c.exited)
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		c.counters.wakeups.Add(1)
		c.pollUntilIdle()
	}
}

// pollUntilIdle polls until the CQ is empty and re-armed, or Stop.
func (c *Context) pollUntilIdle() {
	for !c.stopping.Load() {
		switch c.poll() {
		case pollExhausted:
			c.counters.budgetExhausted.Add(1)
			// Without re-arming: more completions are surely queued,
			// but let other goroutines (the other CQ's Context, the
			// producers) run first, as NAPI returns to the softirq loop.
			runtime.Gosched()
		case pollMissed:
			c.counters.missedEventRepolls.Add(1)
		case pollArmed, pollStopped, pollLeftUnarmed:
			return
		}
	}
}

// pollResult is how a poll ended.
//
//go:generate go tool stringer -type=pollResult -linecomment
type pollResult int

const (
	// pollArmed: under budget, CQ re-armed, nothing missed: sleep.
	pollArmed pollResult = iota // armed
	// pollMissed: under budget, but the re-arm reported queued
	// completions: poll again.
	pollMissed // missed
	// pollExhausted: the whole budget was used: yield, poll again.
	pollExhausted // exhausted
	// pollStopped: Stop was called during the poll.
	pollStopped // stopped
	// pollLeftUnarmed: under budget, but a busy poller owns re-arming:
	// sleep without arming; the busy poller arms in EndBusyPoll.
	pollLeftUnarmed // left-unarmed
)

// poll is one pass over the CQ under the poll lock.
func (c *Context) poll() pollResult {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	return c.pollLocked()
}

// pollLocked is poll under the poll lock.
func (c *Context) pollLocked() pollResult {
	// Counted first so that Handle can tell which poll it is part of.
	c.counters.polls.Add(1)
	done, stopped := c.drainLocked()
	switch {
	case stopped:
		return pollStopped
	case done == c.cfg.Budget:
		return pollExhausted
	case c.busy.Load():
		// Read under the poll lock: EndBusyPoll clears busy before it
		// takes the lock (or schedules a poll), so either this poll sees
		// false and arms, or EndBusyPoll arms after it.
		c.counters.leftUnarmed.Add(1)
		return pollLeftUnarmed
	}
	c.counters.rearms.Add(1)
	if c.cfg.CQ.Notify(true) {
		return pollMissed
	}
	return pollArmed
}

// drainLocked hands up to Budget completions to Handle, in batches; under
// the poll lock. It reports how many, and whether Stop interrupted it.
func (c *Context) drainLocked() (done int, stopped bool) {
	budget, batch := c.cfg.Budget, c.cfg.Batch
	if len(c.deferred) > 0 && !c.inline {
		// What an inline poll handed back comes before anything newer.
		n := len(c.deferred)
		c.cfg.Handle(c.deferred)
		clear(c.deferred)
		c.deferred = c.deferred[:0]
		done += n
	}
	for done < budget {
		if c.stopping.Load() {
			stopped = true
			break
		}
		want := min(batch, budget-done)
		n := c.cfg.CQ.Poll(c.wcs[:want])
		if n <= 0 {
			break
		}
		n = min(n, want) // a misbehaving backend must not push us over budget
		d0 := len(c.deferred)
		c.cfg.Handle(c.wcs[:n])
		// Drop the references so a destroyed QP's context is not kept
		// alive by the poll buffer.
		clear(c.wcs[:n])
		// Deferred completions count when the goroutine handles them.
		done += n - (len(c.deferred) - d0)
		if n < want || len(c.deferred) > 0 {
			// The CQ ran dry (a further Poll would return 0), or Handle
			// deferred work to the poll goroutine.
			break
		}
	}
	c.counters.notePoll(done)
	if (done < budget || stopped) && c.cfg.Complete != nil {
		c.cfg.Complete()
	}
	return done, stopped
}
