package napi

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
)

var errCQFull = errors.New("fake CQ full")

// fakeCQ models an hca.CQ faithfully enough to race with the poller: a
// fixed ring under a mutex, a one-shot armed flag, the completion event fired
// outside the lock when a completion lands on an armed CQ, and
// Notify(reportMissed) that returns true iff the ring is non-empty.
type fakeCQ struct {
	mu    sync.Mutex
	ring  []hca.WC
	head  int
	count int
	armed bool
	// pollSizes records len(into) of every Poll, when recordPolls is set.
	recordPolls bool
	pollSizes   []int

	// onCompletion is the completion event (CQConfig.OnCompletion).
	onCompletion func()
	// ignoreReportMissed breaks the contract on purpose: Notify arms but
	// always returns false.
	ignoreReportMissed bool
	// onDrained, if set, runs outside the lock after a Poll that left the
	// ring empty: the moment a completion arriving is not seen by the
	// poller and raises no event, because the CQ is not armed. n is what
	// that Poll returned.
	onDrained func(n int)

	events  atomic.Uint64
	notifys atomic.Uint64
}

func newFakeCQ(capacity int) *fakeCQ {
	return &fakeCQ{ring: make([]hca.WC, capacity)}
}

// add queues wcs and fires the completion event if the CQ was armed.
func (f *fakeCQ) add(wcs ...hca.WC) error {
	f.mu.Lock()
	if f.count+len(wcs) > len(f.ring) {
		f.mu.Unlock()
		return errCQFull
	}
	for _, wc := range wcs {
		f.ring[(f.head+f.count)%len(f.ring)] = wc
		f.count++
	}
	fire := f.armed && len(wcs) > 0
	if fire {
		f.armed = false
	}
	f.mu.Unlock()
	if fire {
		f.events.Add(1)
		f.onCompletion()
	}
	return nil
}

func (f *fakeCQ) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count
}

func (f *fakeCQ) isArmed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.armed
}

func (f *fakeCQ) polls() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.pollSizes...)
}

func (f *fakeCQ) Poll(into []hca.WC) int {
	f.mu.Lock()
	if f.recordPolls {
		f.pollSizes = append(f.pollSizes, len(into))
	}
	n := min(len(into), f.count)
	for i := range n {
		into[i] = f.ring[f.head]
		f.ring[f.head] = hca.WC{}
		f.head = (f.head + 1) % len(f.ring)
	}
	f.count -= n
	drained := f.count == 0
	f.mu.Unlock()
	if drained && f.onDrained != nil {
		f.onDrained(n)
	}
	return n
}

func (f *fakeCQ) Notify(reportMissed bool) bool {
	f.notifys.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = true
	if f.ignoreReportMissed {
		return false
	}
	return reportMissed && f.count > 0
}

func (f *fakeCQ) Destroy() error { return nil }

// recvWC is a receive completion with id.
func recvWC(id uint64) hca.WC {
	return hca.WC{ID: id, Opcode: hca.WCRecv, Status: hca.StatusSuccess, ByteLen: 64}
}
