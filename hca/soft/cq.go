package soft

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/internal/core"
)

// cqEntry is one CQE; its QP lets Poll count completions of destroyed
// QPs and lets the purge policy find them.
type cqEntry = core.Entry[*qp]

// heldEntry is a completion held back by Faults.CompletionDelay or a
// CompletionHold.
type heldEntry struct {
	e   cqEntry
	due time.Time
}

// cq is a soft completion queue: a preallocated ring under its own lock.
type cq struct {
	f   *Fabric
	dev *Device
	cfg hca.CQConfig

	mu    sync.Mutex // guards ring, armed, rng
	ring  core.Ring[*qp]
	armed bool
	rng   *rand.Rand // spurious-event draws; seeded from the fabric rng

	destroyed atomic.Bool

	// Guarded by f.mu.
	users   int // QPs using this CQ
	held    []heldEntry
	lastDue time.Time
	holding bool // a CompletionHold is on: every completion waits in held
}

var _ hca.CQ = (*cq)(nil)

// CreateCQ makes a CQ of cfg.Size entries.
func (d *Device) CreateCQ(cfg hca.CQConfig) (hca.CQ, error) {
	if cfg.Size <= 0 || cfg.Size > maxCQE {
		return nil, fmt.Errorf("soft: %s: create CQ of %d entries: %w", d.name, cfg.Size, hca.ErrInvalidArgument)
	}
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("soft: %s: create CQ: %w", d.name, hca.ErrDestroyed)
	}
	c := &cq{
		f:    f,
		dev:  d,
		cfg:  cfg,
		ring: core.NewRing[*qp](cfg.Size),
		rng:  rand.New(rand.NewPCG(f.rng.Uint64(), f.rng.Uint64())),
	}
	d.cqs[c] = struct{}{}
	f.live.cqs++
	return c, nil
}

// complete queues wc for c, or holds it back behind earlier held ones;
// under f.mu.
func (f *Fabric) complete(c *cq, q *qp, wc hca.WC) {
	if c.destroyed.Load() {
		return
	}
	e := cqEntry{WC: wc, QP: q}
	if c.holding {
		c.holdLocked(e)
		return
	}
	delay := f.faults.CompletionDelay
	if len(c.held) == 0 && !f.chance(delay.Probability) {
		c.push(e)
		return
	}
	due := time.Now().Add(f.randDuration(delay.Max))
	if due.Before(c.lastDue) {
		due = c.lastDue
	}
	c.lastDue = due
	c.held = append(c.held, heldEntry{e: e, due: due})
	f.live.held++
	f.stats.delayed.Add(1)
	f.sched.after(time.Until(due), func() { f.releaseHeld(c) })
}

// releaseHeld moves c's due completions into its ring, oldest first;
// nothing while a CompletionHold is on.
func (f *Fabric) releaseHeld(c *cq) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.holding {
		return
	}
	c.moveDueLocked(time.Now(), len(c.held))
}

// moveDueLocked moves up to limit of c's held completions that are due at
// now into its ring, oldest first, stopping at the first one not due; under
// f.mu. It returns how many it moved.
func (c *cq) moveDueLocked(now time.Time, limit int) int {
	k := 0
	for k < limit && k < len(c.held) && !c.held[k].due.After(now) {
		if !c.destroyed.Load() {
			c.push(c.held[k].e)
		}
		k++
	}
	if k == 0 {
		return 0
	}
	n := copy(c.held, c.held[k:])
	clear(c.held[n:])
	c.held = c.held[:n]
	c.f.live.held -= k
	return k
}

// push appends e to the ring, raising CQ_ERR on overflow and the
// completion event if the CQ was armed.
func (c *cq) push(e cqEntry) {
	c.mu.Lock()
	if !c.ring.Push(e) {
		c.mu.Unlock()
		c.f.stats.cqOverflows.Add(1)
		c.f.event(c.cfg.OnEvent, hca.AsyncEvent{Type: hca.EventCQErr})
		return
	}
	fire := c.armed
	c.armed = false
	c.mu.Unlock()
	if fire {
		c.f.completionEvent(c)
	}
}

// completionEvent raises c's completion event: inline when the consumer
// allowed it (delivered by the fabric lock's Unlock), else through the
// dispatcher; under f.mu.
func (f *Fabric) completionEvent(c *cq) {
	if c.cfg.InlineCompletion && f.mu.deferFire(c) {
		f.stats.inlineEvents.Add(1)
		return
	}
	f.stats.dispatchedEvents.Add(1)
	f.disp.post(notification{cq: c})
}

func (c *cq) fireCompletion() {
	if !c.destroyed.Load() && c.cfg.OnCompletion != nil {
		c.cfg.OnCompletion()
	}
}

// Poll moves up to len(into) completions out of the CQ.
func (c *cq) Poll(into []hca.WC) int {
	c.mu.Lock()
	n, afterDestroy := c.ring.Poll(into)
	c.mu.Unlock()
	if afterDestroy > 0 {
		c.f.stats.completionsAfterDestroy.Add(afterDestroy)
	}
	return n
}

// Notify arms the CQ; with reportMissed it reports whether the CQ holds
// completions already.
func (c *cq) Notify(reportMissed bool) bool {
	p := math.Float64frombits(c.f.spuriousBits.Load())
	c.mu.Lock()
	if c.destroyed.Load() {
		c.mu.Unlock()
		return false
	}
	c.armed = true
	nonEmpty := c.ring.Len() > 0
	spurious := p > 0 && c.rng.Float64() < p
	if spurious {
		c.armed = false
	}
	c.mu.Unlock()
	if spurious {
		c.f.stats.spurious.Add(1)
		c.f.disp.post(notification{cq: c})
	}
	return reportMissed && nonEmpty
}

// Destroy frees the CQ; it fails with ErrBusy while QPs use it.
func (c *cq) Destroy() error {
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.destroyed.Load() {
		return fmt.Errorf("soft: destroy CQ: %w", hca.ErrDestroyed)
	}
	if c.users > 0 {
		return fmt.Errorf("soft: destroy CQ used by %d QPs: %w", c.users, hca.ErrBusy)
	}
	f.destroyCQLocked(c)
	return nil
}

func (f *Fabric) destroyCQLocked(c *cq) {
	c.destroyed.Store(true)
	c.mu.Lock()
	c.ring.Clear()
	c.armed = false
	c.mu.Unlock()
	f.live.held -= len(c.held)
	c.held = nil
	delete(c.dev.cqs, c)
	f.live.cqs--
}

// purge removes q's completions from the ring and the held queue; under
// f.mu. It returns how many it removed.
func (c *cq) purge(q *qp) int {
	removed := 0
	kept := c.held[:0]
	for _, h := range c.held {
		if h.e.QP == q {
			removed++
			continue
		}
		kept = append(kept, h)
	}
	clear(c.held[len(kept):])
	c.held = kept
	c.f.live.held -= removed

	c.mu.Lock()
	removed += c.ring.Purge(q)
	c.mu.Unlock()
	return removed
}
