package ipoibcm

// Global TX credits (kernel-ipoib.md §6.1, design note 3): one count of
// sends posted or parked, over the UD QP and every connection. The host
// reader stops reading when the count reaches SendQueueSize-1 and resumes
// when completions bring it down to half, so no per-QP send queue and no
// CQ can overflow, and one stuck peer cannot wedge another's traffic
// forever (the 2008 "never recovers" bug had one stop flag per ring).

// creditsFree is how many frames the reader may take now.
func (i *Interface) creditsFree() int {
	return i.cfg.SendQueueSize - int(i.outstanding.Load())
}

// returnCredits gives n credits back and wakes the reader if it stopped
// and the count fell to half. Called by the TX poller and by whoever
// drops a parked frame.
func (i *Interface) returnCredits(n int) {
	if n == 0 {
		return
	}
	left := i.outstanding.Add(int64(-n))
	if left <= int64(i.cfg.SendQueueSize/2) && i.txStopped.Load() && i.txStopped.CompareAndSwap(true, false) {
		i.rs.txWakes.Add(1)
		select {
		case i.txWake <- struct{}{}:
		default:
		}
	}
}

// waitCredits blocks the reader while the queue is stopped. It returns
// false when the interface is stopping.
func (i *Interface) waitCredits() bool {
	if i.outstanding.Load() < int64(i.cfg.SendQueueSize-1) {
		return true
	}
	// Reap what has completed before stopping the queue (the reader
	// busy-polls the TX CQ).
	i.txNAPI.BusyPoll()
	if i.outstanding.Load() < int64(i.cfg.SendQueueSize-1) {
		return true
	}
	i.rs.txStops.Add(1)
	return i.stopQueue(stopForCredits)
}

// stopReason is what the stopped reader waits for.
//
//go:generate go tool stringer -type=stopReason -linecomment
type stopReason int

const (
	// stopForCredits: outstanding sends at the limit
	stopForCredits stopReason = iota // credits
	// stopForBuffers: every TX pool buffer in flight
	stopForBuffers // buffers
)

// resumable reports whether what the reader stopped for came back: the
// credits fell to half (the level returnCredits wakes at) or a buffer is
// free.
func (i *Interface) resumable(why stopReason) bool {
	if why == stopForBuffers {
		return i.pool.available() > 0
	}
	return i.outstanding.Load() <= int64(i.cfg.SendQueueSize/2)
}

// stopQueue stops the reader until returnCredits wakes it. It returns
// false when the interface is stopping.
//
// The order is what makes the wake-up impossible to lose: completions that
// land before txStopped is set do not wake (nobody is stopped yet), so the
// condition is checked again after the store; completions after it find
// txStopped and wake. Whoever flips txStopped back to false (the re-check
// here or returnCredits) owns the resumption.
func (i *Interface) stopQueue(why stopReason) bool {
	if h := i.hooks.beforeTXStop; h != nil {
		h(why)
	}
	i.txStopped.Store(true)
	// A stopped queue waits for completion events: hand re-arming back
	// to the TX poller (after txStopped is set, so the poll that returns
	// the credits sees it and wakes us).
	i.txNAPI.EndBusyPoll()
	if i.resumable(why) && i.txStopped.CompareAndSwap(true, false) {
		return true
	}
	for {
		select {
		case <-i.txWake:
			if !i.txStopped.Load() {
				return true
			}
		case <-i.stop:
			return false
		}
	}
}
