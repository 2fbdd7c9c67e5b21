package bench

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
)

// verbsWatch stands between one Interface and its device and checks the
// dead-flag invariant from outside the engine, through the verbs contract
// alone: once the consumer has started to move a QP to Error, every
// receive completion of that QP polled by a Poll that began afterwards
// must come back through Config.OnDeadCompletion (recycled, counted
// rx_dead_dropped) before the poller polls again; if it does not, the
// engine delivered a completion of a connection in teardown.
//
// The engine marks the connection dead under the poll lock before it
// calls Modify(Error), so no correct poll can miss the flag: an epoch
// taken when the Modify begins and one taken when a Poll begins order
// the two without a false alarm.
type verbsWatch struct {
	host  int
	viol  *soakViolations
	epoch atomic.Uint64

	mu sync.Mutex
	// doomed maps a QP's context to the epoch its consumer began moving
	// it to Error; forgotten when the QP is destroyed.
	doomed map[any]uint64
	// pending are doomed receive completions handed to the consumer and
	// not yet reported dead, with the CQ that returned them.
	pending map[doomKey]*watchedCQ

	checked  atomic.Uint64 // doomed completions seen recycled
	violated atomic.Uint64 // doomed completions delivered
}

type doomKey struct {
	ctx any
	id  uint64
}

func newVerbsWatch(host int, viol *soakViolations) *verbsWatch {
	return &verbsWatch{host: host, viol: viol, doomed: make(map[any]uint64), pending: make(map[doomKey]*watchedCQ)}
}

// wrap returns dev with its CQs and QPs watched.
func (w *verbsWatch) wrap(dev hca.Device) hca.Device { return &watchedDevice{Device: dev, w: w} }

// reportDead is the Interface's OnDeadCompletion: wc was recycled.
func (w *verbsWatch) reportDead(wc *hca.WC) {
	k := doomKey{wc.Context, wc.ID}
	w.mu.Lock()
	if _, ok := w.pending[k]; ok {
		delete(w.pending, k)
		w.checked.Add(1)
	}
	w.mu.Unlock()
}

// settle runs when cq's poller comes back for more (Poll or Notify): the
// previous batch has been handled, so anything doomed in it and still
// pending was delivered.
func (w *verbsWatch) settle(cq *watchedCQ) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, c := range w.pending {
		if cq != nil && c != cq {
			continue
		}
		delete(w.pending, k)
		w.violated.Add(1)
		w.viol.record(violDeadDelivered, fmt.Sprintf("host %d: receive completion (wr %#x) of a QP moved to Error before the poll was delivered", w.host, k.id))
	}
}

// note records the doomed receive completions among wcs, returned by a
// Poll that began at epoch start.
func (w *verbsWatch) note(cq *watchedCQ, wcs []hca.WC, start uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.doomed) == 0 {
		return
	}
	for k := range wcs {
		wc := &wcs[k]
		if wc.Opcode != hca.WCRecv {
			continue
		}
		if e, ok := w.doomed[wc.Context]; ok && e <= start {
			w.pending[doomKey{wc.Context, wc.ID}] = cq
		}
	}
}

func (w *verbsWatch) doom(ctx any) {
	w.mu.Lock()
	if _, ok := w.doomed[ctx]; !ok {
		w.doomed[ctx] = w.epoch.Add(1)
	}
	w.mu.Unlock()
}

func (w *verbsWatch) forget(ctx any) {
	w.mu.Lock()
	delete(w.doomed, ctx)
	w.mu.Unlock()
}

// watchedDevice wraps CQs and QPs; everything else passes through.
type watchedDevice struct {
	hca.Device
	w *verbsWatch
}

func (d *watchedDevice) CreateCQ(cfg hca.CQConfig) (hca.CQ, error) {
	c, err := d.Device.CreateCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &watchedCQ{CQ: c, w: d.w}, nil
}

func (d *watchedDevice) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	cfg.SendCQ = unwrapCQ(cfg.SendCQ)
	cfg.RecvCQ = unwrapCQ(cfg.RecvCQ)
	q, err := d.Device.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	return &watchedQP{QP: q, w: d.w, ctx: cfg.Context}, nil
}

func unwrapCQ(c hca.CQ) hca.CQ {
	if wc, ok := c.(*watchedCQ); ok {
		return wc.CQ
	}
	return c
}

type watchedCQ struct {
	hca.CQ
	w *verbsWatch
}

func (c *watchedCQ) Poll(into []hca.WC) int {
	c.w.settle(c)
	start := c.w.epoch.Load()
	n := c.CQ.Poll(into)
	if n > 0 {
		c.w.note(c, into[:n], start)
	}
	return n
}

func (c *watchedCQ) Notify(reportMissed bool) bool {
	c.w.settle(c)
	return c.CQ.Notify(reportMissed)
}

type watchedQP struct {
	hca.QP
	w   *verbsWatch
	ctx any
}

func (q *watchedQP) Modify(attr hca.QPAttr) error {
	if attr.State == hca.QPStateError {
		q.w.doom(q.ctx)
	}
	return q.QP.Modify(attr)
}

func (q *watchedQP) Destroy() error {
	q.w.forget(q.ctx)
	return q.QP.Destroy()
}
