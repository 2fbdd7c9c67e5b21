package ipoibcm

import (
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/internal/workq"
)

// control is the ordered control loop's queue: work items run one at a
// time, in posting order, on one goroutine (Linux's ordered priv->wq).
// Posting never blocks, so CM handlers, async-event callbacks and the
// pollers can hand work over without waiting for it.
type control struct {
	q       *workq.Queue[func()]
	stopped chan struct{}
	once    sync.Once
}

func (c *control) init() {
	c.q = workq.New[func()]()
	c.stopped = make(chan struct{})
}

// post queues fn for the control loop.
func (c *control) post(fn func()) { c.q.Post(fn) }

func (c *control) stopLoop() { c.once.Do(func() { close(c.stopped) }) }

// controlLoop runs posted work and the periodic tasks: the passive stale
// scan, neighbour and send-only multicast aging and, during Close, the drain deadline.
func (i *Interface) controlLoop() {
	defer i.ctlWG.Done()
	stale := time.NewTicker(i.cfg.StaleScan)
	defer stale.Stop()
	gc := time.NewTicker(max(min(i.cfg.NeighbourTimeout, i.cfg.McastSendOnlyTimeout)/2, time.Millisecond))
	defer gc.Stop()
	for {
		var deadline <-chan time.Time
		if i.shut.timer != nil {
			deadline = i.shut.timer.C
		}
		select {
		case <-i.ctl.q.Wake():
			q := i.ctl.q.Take()
			for _, fn := range q {
				fn()
			}
			i.ctl.q.Recycle(q)
		case <-stale.C:
			i.passive.staleScan(time.Now())
		case <-gc.C:
			i.ageNeighbours(time.Now())
		case <-deadline:
			i.forceShutdown()
		case <-i.ctl.stopped:
			return
		}
		i.checkShutdown()
		i.checkHostDownQuiet()
	}
}
