package soft

import (
	"container/heap"
	"sync"
	"time"
)

// timedAction is work the scheduler runs at or after due.
type timedAction struct {
	due time.Time
	seq uint64 // FIFO among equal due times
	run func()
}

type actionHeap []timedAction

func (h actionHeap) Len() int { return len(h) }
func (h actionHeap) Less(i, j int) bool {
	if h[i].due.Equal(h[j].due) {
		return h[i].seq < h[j].seq
	}
	return h[i].due.Before(h[j].due)
}
func (h actionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *actionHeap) Push(x any)   { *h = append(*h, x.(timedAction)) }
func (h *actionHeap) Pop() any {
	old := *h
	v := old[len(old)-1]
	old[len(old)-1] = timedAction{}
	*h = old[:len(old)-1]
	return v
}

// scheduler runs timed fabric work (retries, delayed completions and
// events) on one goroutine. Actions take the fabric lock themselves.
type scheduler struct {
	mu      sync.Mutex
	actions actionHeap
	seq     uint64
	wake    chan struct{}
}

func newScheduler() *scheduler { return &scheduler{wake: make(chan struct{}, 1)} }

func (s *scheduler) after(d time.Duration, fn func()) {
	s.mu.Lock()
	s.seq++
	heap.Push(&s.actions, timedAction{due: time.Now().Add(d), seq: s.seq, run: fn})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *scheduler) run(done <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []func()
	for {
		now := time.Now()
		s.mu.Lock()
		for len(s.actions) > 0 && !s.actions[0].due.After(now) {
			due = append(due, heap.Pop(&s.actions).(timedAction).run)
		}
		wait := time.Hour
		if len(s.actions) > 0 {
			wait = s.actions[0].due.Sub(now)
		}
		s.mu.Unlock()
		for i, fn := range due {
			fn()
			due[i] = nil
		}
		due = due[:0]
		timer.Reset(wait)
		select {
		case <-done:
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}
