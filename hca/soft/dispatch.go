package soft

import (
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/workq"
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
	q *workq.Queue[notification]
}

func newDispatcher() *dispatcher {
	return &dispatcher{q: workq.New[notification]()}
}

func (d *dispatcher) post(n notification) { d.q.Post(n) }

func (d *dispatcher) run(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-d.q.Wake():
		}
		batch := d.q.Take()
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
		}
		d.q.Recycle(batch)
	}
}
