package ipoibcm

import (
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/internal/workq"
)

// control is the ordered control loop: work items run one at a time, in
// posting order, on one goroutine (Linux's ordered priv->wq), between the
// periodic tasks and Close's drain deadline. Posting never blocks, so CM
// handlers, async-event callbacks and the pollers can hand work over
// without waiting for it.
type control struct {
	q       *workq.Queue[func()]
	stopped chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// periodic is a task the control loop runs every period.
type periodic struct {
	every time.Duration
	run   func(now time.Time)
}

// controlTasks is what the loop runs besides posted work: the passive
// stale scan, the aging of neighbours and send-only groups, Close's
// drain deadline (shutdown), and the checks that follow any work item.
type controlTasks struct {
	staleScan, age periodic
	shutdown       *shutdown
	after          []func()
}

func (c *control) init() {
	c.q = workq.New[func()]()
	c.stopped = make(chan struct{})
}

// post queues fn for the control loop.
func (c *control) post(fn func()) { c.q.Post(fn) }

// start runs the loop on its own goroutine until stop.
func (c *control) start(t controlTasks) {
	c.wg.Add(1)
	go c.run(t)
}

// stop ends the loop and waits for it; what is still queued never runs.
func (c *control) stop() {
	c.once.Do(func() { close(c.stopped) })
	c.wg.Wait()
}

func (c *control) run(t controlTasks) {
	defer c.wg.Done()
	stale := time.NewTicker(t.staleScan.every)
	defer stale.Stop()
	age := time.NewTicker(t.age.every)
	defer age.Stop()
	for {
		select {
		case <-c.q.Wake():
			q := c.q.Take()
			for _, fn := range q {
				fn()
			}
			c.q.Recycle(q)
		case <-stale.C:
			t.staleScan.run(time.Now())
		case <-age.C:
			t.age.run(time.Now())
		case <-t.shutdown.deadline():
			t.shutdown.force()
		case <-c.stopped:
			return
		}
		for _, fn := range t.after {
			fn()
		}
	}
}
