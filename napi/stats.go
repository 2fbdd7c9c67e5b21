package napi

import "sync/atomic"

// Stats is a snapshot of a Context's counters.
type Stats struct {
	// Polls counts polls: each locked pass over the CQ, empty ones included.
	Polls uint64 `json:"polls"`
	// Completions counts WCs handed to Handle.
	Completions uint64 `json:"completions"`
	// BudgetExhausted counts polls that used the whole budget and were
	// followed by another poll without re-arming.
	BudgetExhausted uint64 `json:"budget_exhausted"`
	// MissedEventRepolls counts re-arms at the end of a poll that reported
	// completions already queued, each followed by another poll. (Start's
	// arm schedules a poll instead and is not counted here.)
	MissedEventRepolls uint64 `json:"missed_event_repolls"`
	// Wakeups counts times the goroutine was woken by Schedule.
	Wakeups uint64 `json:"wakeups"`
	// Rearms counts CQ.Notify calls (the one in Start included).
	Rearms uint64 `json:"rearms"`
	// MaxPerPoll is the most completions one poll handled; never above
	// the budget.
	MaxPerPoll int `json:"max_per_poll"`
	// BusyPolls counts BusyPoll calls that polled (took the poll lock);
	// BusyPollsContended those that found a poll running and returned.
	// Their completions are in Completions; they are not in Polls.
	BusyPolls          uint64 `json:"busy_polls"`
	BusyPollsContended uint64 `json:"busy_polls_contended"`
	// LeftUnarmed counts polls of the goroutine that ended without
	// re-arming because a busy poller owned re-arming.
	LeftUnarmed uint64 `json:"left_unarmed"`
	// BusyPollEnds counts EndBusyPoll calls that handed re-arming back.
	BusyPollEnds uint64 `json:"busy_poll_ends"`
	// InlinePolls counts polls Schedule ran on its caller's goroutine
	// (Config.Inline); they are in Polls too. Deferred counts the
	// completions their Handle handed back to the poll goroutine.
	InlinePolls uint64 `json:"inline_polls"`
	Deferred    uint64 `json:"deferred"`
}

// AvgPerPoll is the mean number of completions per poll, 0 before any poll.
func (s Stats) AvgPerPoll() float64 {
	if s.Polls == 0 {
		return 0
	}
	return float64(s.Completions) / float64(s.Polls)
}

// counters are written by the poll goroutine (and Start) and read by Stats
// from anywhere, hence atomics; the data path adds to them once per poll,
// not per completion.
type counters struct {
	polls              atomic.Uint64
	completions        atomic.Uint64
	budgetExhausted    atomic.Uint64
	missedEventRepolls atomic.Uint64
	wakeups            atomic.Uint64
	rearms             atomic.Uint64
	maxPerPoll         atomic.Int64
	busyPolls          atomic.Uint64
	busyContended      atomic.Uint64
	leftUnarmed        atomic.Uint64
	busyEnds           atomic.Uint64
	inlinePolls        atomic.Uint64
	deferred           atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Polls:              c.polls.Load(),
		Completions:        c.completions.Load(),
		BudgetExhausted:    c.budgetExhausted.Load(),
		MissedEventRepolls: c.missedEventRepolls.Load(),
		Wakeups:            c.wakeups.Load(),
		Rearms:             c.rearms.Load(),
		MaxPerPoll:         int(c.maxPerPoll.Load()),
		BusyPolls:          c.busyPolls.Load(),
		BusyPollsContended: c.busyContended.Load(),
		LeftUnarmed:        c.leftUnarmed.Load(),
		BusyPollEnds:       c.busyEnds.Load(),
		InlinePolls:        c.inlinePolls.Load(),
		Deferred:           c.deferred.Load(),
	}
}

// notePoll records a finished poll of n completions. It is called under the
// poll lock (by the poll goroutine or a busy poller), so the max needs no
// compare-and-swap.
func (c *counters) notePoll(n int) {
	c.completions.Add(uint64(n))
	if int64(n) > c.maxPerPoll.Load() {
		c.maxPerPoll.Store(int64(n))
	}
}
