package rocev2

import "time"

// A real HCA writes a CQE when its hardware gets to it: a completion can
// reach the CQ well after the work finished, even after the consumer
// destroyed the QP (IBTA leaves the CQ's content to the consumer; the
// consumer's drain WR is what proves a QP has nothing left in flight).
// This backend otherwise completes synchronously under the device lock, so
// a consumer that destroys a QP too early would almost never be caught.
// Faults.HoldCompletion adds the lag, modelled on the soft fabric's
// completion delay (hca/soft/cq.go): a held completion keeps every later
// completion of its CQ behind it, so a CQ's order stays the order the
// completions were produced in and a drain still covers everything before
// it.

// heldCQE is a completion kept out of its CQ's ring until due.
type heldCQE struct {
	e   cqe
	due time.Time
}

// holdDraw reports whether the next completion is held back; mu held.
func (d *Device) holdDraw() bool {
	p := d.cfg.Faults.HoldCompletion
	return p > 0 && d.holdRng.Float64() < p
}

// hold queues e behind c's held completions; mu held. A drawn completion
// waits up to HoldCompletionMax; one queued behind is due no earlier than
// the one ahead of it.
func (c *cq) hold(e cqe) {
	d := c.dev
	now := time.Now()
	due := now
	if len(c.held) == 0 {
		due = now.Add(1 + time.Duration(d.holdRng.Int64N(int64(d.cfg.Faults.HoldCompletionMax))))
		d.heldCQs[c] = struct{}{}
		d.kickTimers()
	}
	if due.Before(c.lastDue) {
		due = c.lastDue
	}
	c.lastDue = due
	c.held = append(c.held, heldCQE{e: e, due: due})
	d.heldCompletions++
	d.ctr.completionsHeld.Add(1)
}

// releaseDue moves c's due completions into its ring, oldest first, and
// returns when the next one is due (zero if none is left); mu held.
func (c *cq) releaseDue(now time.Time) time.Time {
	k := 0
	for ; k < len(c.held) && !c.held[k].due.After(now); k++ {
		c.insert(c.held[k].e)
	}
	n := copy(c.held, c.held[k:])
	clear(c.held[n:])
	c.held = c.held[:n]
	c.dev.heldCompletions -= k
	if n == 0 {
		delete(c.dev.heldCQs, c)
		return time.Time{}
	}
	return c.held[0].due
}

// dropHeld discards c's held completions (the CQ is destroyed); mu held.
func (c *cq) dropHeld() {
	c.dev.heldCompletions -= len(c.held)
	c.held = nil
	delete(c.dev.heldCQs, c)
}

// releaseCompletions releases every CQ's due held completions and returns
// the earliest release time left, zero if none; mu held, called by the
// timer loop.
func (d *Device) releaseCompletions(now time.Time) time.Time {
	var next time.Time
	for c := range d.heldCQs {
		if due := c.releaseDue(now); !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	return next
}
