package soft

import (
	"sync"

	"github.com/ipoibcm/ipoib/hca"
)

// notification is one callback the dispatcher makes: a completion event of
// cq, or an asynchronous event ev for handler fn.
type notification struct {
	cq *cq
	fn func(hca.AsyncEvent)
	ev hca.AsyncEvent
}

// dispatcher delivers callbacks in order from one goroutine, outside every
// fabric lock, so handlers may re-enter the verbs and posting never calls
// the consumer synchronously.
type dispatcher struct {
	mu    sync.Mutex
	queue []notification
	spare []notification
	wake  chan struct{}
}

func newDispatcher() *dispatcher {
	return &dispatcher{wake: make(chan struct{}, 1)}
}

func (d *dispatcher) post(n notification) {
	d.mu.Lock()
	d.queue = append(d.queue, n)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *dispatcher) run(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-d.wake:
		}
		d.mu.Lock()
		batch := d.queue
		d.queue = d.spare[:0]
		d.spare = nil
		d.mu.Unlock()
		for i := range batch {
			select {
			case <-done:
				return
			default:
			}
			n := &batch[i]
			if n.cq != nil {
				n.cq.fireCompletion()
			} else if n.fn != nil {
				n.fn(n.ev)
			}
			*n = notification{}
		}
		d.mu.Lock()
		d.spare = batch[:0]
		d.mu.Unlock()
	}
}
