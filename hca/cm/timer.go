package cm

import (
	"container/heap"
	"time"
)

// deadlines is a min-heap of connections by their next deadline, so the
// Manager runs one time.Timer for any number of connections.
type deadlines []*Conn

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].deadline.Before(d[j].deadline) }
func (d deadlines) Swap(i, j int) {
	d[i], d[j] = d[j], d[i]
	d[i].heapIndex = i
	d[j].heapIndex = j
}

func (d *deadlines) Push(x any) {
	c := x.(*Conn)
	c.heapIndex = len(*d)
	*d = append(*d, c)
}

func (d *deadlines) Pop() any {
	old := *d
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*d = old[:len(old)-1]
	c.heapIndex = -1
	return c
}

// setDeadline (re)arms c's timer to fire after d. m.mu must be held.
func (m *Manager) setDeadline(c *Conn, d time.Duration) {
	c.deadline = time.Now().Add(d)
	if c.heapIndex >= 0 {
		heap.Fix(&m.deadlines, c.heapIndex)
	} else {
		heap.Push(&m.deadlines, c)
	}
	m.armTimer()
}

// clearDeadline disarms c's timer. m.mu must be held.
func (m *Manager) clearDeadline(c *Conn) {
	if c.heapIndex >= 0 {
		heap.Remove(&m.deadlines, c.heapIndex)
	}
}

// armTimer points the Manager's timer at the earliest deadline if it is
// earlier than what the timer waits for. A timer that fires early only
// costs one empty scan. m.mu must be held.
func (m *Manager) armTimer() {
	if len(m.deadlines) == 0 {
		return
	}
	next := m.deadlines[0].deadline
	if m.timerArmed && !next.Before(m.timerAt) {
		return
	}
	m.timerAt, m.timerArmed = next, true
	m.timer.Reset(time.Until(next))
}

// expire runs the timeouts of every connection whose deadline passed.
// m.mu must be held.
func (m *Manager) expire() {
	m.timerArmed = false
	now := time.Now()
	for len(m.deadlines) > 0 && !m.deadlines[0].deadline.After(now) {
		c := heap.Pop(&m.deadlines).(*Conn)
		m.onTimeout(c)
	}
	m.armTimer()
}
