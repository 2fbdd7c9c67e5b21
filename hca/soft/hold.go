package soft

import (
	"fmt"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// CompletionHold is test support: a hold Fabric.HoldCompletions put on one
// CQ. While it is on, every completion for the CQ (sends, receives,
// flushes) waits outside the ring, so Poll finds nothing and no completion
// event fires; Pass lets some in, Release ends the hold.
//
// It makes "completions lag the sender" a fact instead of a timing: a
// consumer's send-queue back-pressure, for one, can then be driven to its
// limit, part way back and back again on a loaded machine.
//
// Held completions count in FabricStats.PendingCompletion and queue in
// order with those Faults.CompletionDelay holds back: nothing passes a
// delayed completion before its due time, and while the hold is on nothing
// enters the ring but what Pass lets in.
type CompletionHold struct {
	f    *Fabric
	c    *cq
	once sync.Once
}

// HoldCompletions puts a hold on c until the returned hold is released.
// It fails for a CQ of another backend or fabric (ErrInvalidArgument), a
// destroyed CQ (ErrDestroyed) and a CQ already held (ErrBusy).
func (f *Fabric) HoldCompletions(c hca.CQ) (*CompletionHold, error) {
	sc, ok := c.(*cq)
	if !ok || sc.f != f {
		return nil, fmt.Errorf("soft: hold completions of %T: not a CQ of this fabric: %w", c, hca.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sc.destroyed.Load() {
		return nil, fmt.Errorf("soft: hold completions: CQ: %w", hca.ErrDestroyed)
	}
	if sc.holding {
		return nil, fmt.Errorf("soft: hold completions: CQ already held: %w", hca.ErrBusy)
	}
	sc.holding = true
	return &CompletionHold{f: f, c: sc}, nil
}

// Pass lets the oldest n held completions into the ring (fewer if fewer
// are held, or one ahead is still delayed) and keeps the hold on. It raises
// the completion event if the CQ is armed; an inline event is delivered by
// the caller's goroutine, as a poster's is. It returns how many it let in:
// none once the hold was released or the CQ destroyed.
func (h *CompletionHold) Pass(n int) int {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if !h.c.holding || h.c.destroyed.Load() {
		return 0
	}
	return h.c.moveDueLocked(time.Now(), n)
}

// Release ends the hold and lets every held completion that is due into
// the ring, oldest first, like Pass; one still delayed keeps its scheduled
// release, which takes those behind it along. Release is idempotent and
// harmless after the CQ or the fabric is gone.
func (h *CompletionHold) Release() {
	h.once.Do(func() {
		h.f.mu.Lock()
		h.c.holding = false
		h.f.mu.Unlock()
		h.f.releaseHeld(h.c)
	})
}

// holdLocked queues e behind c's held completions until the hold passes or
// releases it; under f.mu. Its due time is never before the entries ahead
// of it, so moveDueLocked, which stops at the first entry not yet due,
// keeps the order.
func (c *cq) holdLocked(e cqEntry) {
	due := time.Now()
	if due.Before(c.lastDue) {
		due = c.lastDue
	}
	c.lastDue = due
	c.held = append(c.held, heldEntry{e: e, due: due})
	c.f.live.held++
}
