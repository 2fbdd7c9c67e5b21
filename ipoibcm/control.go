package ipoibcm

import (
	"sync"
	"time"
)

// control is the ordered control loop's queue: work items run one at a
// time, in posting order, on one goroutine (Linux's ordered priv->wq).
// Posting never blocks, so CM handlers, async-event callbacks and the
// pollers can hand work over without waiting for it.
type control struct {
	mu      sync.Mutex
	queue   []func()
	spare   []func()
	wake    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

func (c *control) init() {
	c.wake = make(chan struct{}, 1)
	c.stopped = make(chan struct{})
}

// post queues fn for the control loop.
func (c *control) post(fn func()) {
	c.mu.Lock()
	c.queue = append(c.queue, fn)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// take swaps out the queued work.
func (c *control) take() []func() {
	c.mu.Lock()
	q := c.queue
	c.queue = c.spare[:0]
	c.mu.Unlock()
	return q
}

func (c *control) stopLoop() { c.once.Do(func() { close(c.stopped) }) }

// controlLoop runs posted work and the periodic tasks: the passive stale
// scan, neighbour aging and, during Close, the drain deadline.
func (i *Interface) controlLoop() {
	defer i.ctlWG.Done()
	stale := time.NewTicker(i.cfg.StaleScan)
	defer stale.Stop()
	gc := time.NewTicker(max(i.cfg.NeighbourTimeout/2, time.Millisecond))
	defer gc.Stop()
	for {
		var deadline <-chan time.Time
		if i.reaper.shutdownTimer != nil {
			deadline = i.reaper.shutdownTimer.C
		}
		select {
		case <-i.ctl.wake:
			q := i.ctl.take()
			for k, fn := range q {
				fn()
				q[k] = nil
			}
			i.ctl.mu.Lock()
			i.ctl.spare = q[:0]
			i.ctl.mu.Unlock()
		case <-stale.C:
			i.staleScan(time.Now())
		case <-gc.C:
			i.ageNeighbours(time.Now())
		case <-deadline:
			i.forceShutdown()
		case <-i.ctl.stopped:
			return
		}
		i.checkShutdown()
	}
}
