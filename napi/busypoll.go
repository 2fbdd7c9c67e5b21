package napi

// BusyPoll polls the CQ on the caller's goroutine, the way Linux busy-polls
// a NAPI context (napi_busy_loop) and mlx4/mlx5 reap TX completions from
// the transmit path: if no poll holds the poll lock it hands up to Budget
// completions to Handle, under the lock, and returns how many; if a poll is
// running it returns 0 at once, and that poll handles them.
//
// BusyPoll also takes re-arming over from the poll goroutine: until
// EndBusyPoll, a poll of the goroutine that ends under budget leaves the CQ
// unarmed, so completions the caller reaps itself raise no completion event
// and wake nobody. The caller therefore owes an EndBusyPoll before it stops
// polling while completions may still arrive (a transmitter: before it
// blocks with sends outstanding), or they would sit in the CQ unnoticed.
//
// BusyPoll never blocks and does nothing unless the Context is running.
// Handle runs on the caller's goroutine: a Handle used with BusyPoll must
// not call Sync or Stop, which cannot tell that goroutine holds the lock.
func (c *Context) BusyPoll() int {
	if !c.running.Load() {
		return 0
	}
	if !c.busy.Load() {
		c.busy.Store(true)
	}
	if !c.pollMu.TryLock() {
		c.counters.busyContended.Add(1)
		return 0
	}
	defer c.pollMu.Unlock()
	if c.stopping.Load() {
		return 0
	}
	c.counters.busyPolls.Add(1)
	done, _ := c.drainLocked()
	return done
}

// EndBusyPoll hands re-arming back to the poll goroutine: it re-arms the CQ
// with missed-event reporting and schedules a poll if completions are
// already queued; if a poll holds the lock it schedules one more poll
// instead, which will re-arm. It never blocks and takes no lock a caller
// might hold, so any goroutine may call it, under any lock (a poster other
// than the busy poller calls it after posting). It does nothing if no busy
// poller owns re-arming.
func (c *Context) EndBusyPoll() {
	if !c.busy.Load() || !c.busy.CompareAndSwap(true, false) {
		return
	}
	c.counters.busyEnds.Add(1)
	if !c.pollMu.TryLock() {
		// The running poll may already have decided to leave the CQ
		// unarmed; the kick makes it (or the next poll) look again.
		c.Schedule()
		return
	}
	if c.stopping.Load() {
		c.pollMu.Unlock()
		return
	}
	c.counters.rearms.Add(1)
	missed := c.cfg.CQ.Notify(true)
	c.pollMu.Unlock()
	if missed {
		c.Schedule()
	}
}
