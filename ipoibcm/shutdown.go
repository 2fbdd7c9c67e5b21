package ipoibcm

import (
	"errors"
	"fmt"
	"time"
)

// Shutdown: Close stops the host reader, then takes every connection
// through its normal teardown on the control loop (beginShutdown), bounded
// by DrainTimeout (forceShutdown), then stops the pollers and the control
// loop and destroys every queue.

// Close stops the interface: its children first (child.go), then the
// host reader, then every connection through the teardown protocol
// (bounded by DrainTimeout), then the pollers, the control loop, the CM
// (unless Config.CMManager brought it) and every queue. The host port is
// closed too. Close is idempotent.
func (i *Interface) Close() error {
	kidsErr := i.children.closeAll()
	err := i.closeSelf()
	if i.parent != nil {
		i.parent.children.release(i.PKey(), i)
	}
	return errors.Join(kidsErr, err)
}

// closeSelf is Close of this interface alone.
func (i *Interface) closeSelf() error {
	i.closeMu.Lock()
	defer i.closeMu.Unlock()
	st := ifState(i.state.Load())
	switch st {
	case ifClosed:
		return i.closeErr
	case ifCreated:
		i.state.Store(int32(ifClosed))
		i.destroyResources()
		i.closeErr = i.host.Close()
		return i.closeErr
	}
	i.state.Store(int32(ifClosing))
	i.link.Store(false)
	_ = i.host.SetLinkUp(false)
	i.closeListener()
	if i.cancelPort != nil {
		i.cancelPort()
	}
	// The reader ends when the port closes; it may be parked waiting for
	// credits, which stop releases.
	hostErr := i.host.Close()
	close(i.stop)
	i.readerWG.Wait()

	done := make(chan struct{})
	i.ctl.post(func() { i.beginShutdown(done) })
	<-done

	i.rxNAPI.Stop()
	i.tx.napi.Stop()
	i.ctl.stopLoop()
	i.ctlWG.Wait()
	i.destroyResources()
	i.state.Store(int32(ifClosed))
	if hostErr != nil && !errors.Is(hostErr, errAlreadyClosed) {
		i.closeErr = fmt.Errorf("%s: close host port: %w", i.cfg.Name, hostErr)
	}
	i.log.Info("closed")
	return i.closeErr
}

var errAlreadyClosed = errors.New("already closed")

// shutdownState is the control loop's part of Close: whether it began,
// whom to tell when it is done, and the DrainTimeout that forces it.
type shutdownState struct {
	active bool
	done   chan struct{}
	timer  *time.Timer
}

// destroyResources releases whatever New created, in dependency order.
// Connections are gone by now (Close reaped or forced them).
func (i *Interface) destroyResources() {
	if i.cmm != nil && i.ownCM {
		i.cmm.Close()
	}
	i.mcast.destroy()
	if i.ud != nil {
		i.ud.destroy()
	}
	if i.srq != nil {
		i.srq.destroy()
	}
	for _, n := range i.neigh.byGID {
		if n.ah != nil {
			n.ah.Destroy()
			n.ah = nil
		}
	}
	i.tx.window.close()
	if i.rxCQ != nil {
		if err := i.rxCQ.Destroy(); err != nil {
			i.log.Warn("destroy RX CQ", "err", err)
		}
	}
	if i.txCQ != nil {
		if err := i.txCQ.Destroy(); err != nil {
			i.log.Warn("destroy TX CQ", "err", err)
		}
	}
}

// beginShutdown tears everything down through the normal protocol
// (control loop); done closes when all is reaped or DrainTimeout forced.
func (i *Interface) beginShutdown(done chan struct{}) {
	r := &i.shut
	r.active = true
	r.done = done
	r.timer = time.NewTimer(i.cfg.DrainTimeout)
	rx, tx := i.snapshotConns()
	for _, rc := range rx {
		i.passive.rxTransition(rc, rxEvShutdown)
	}
	for _, tc := range tx {
		tc.teardown()
	}
}

// snapshotConns copies the RX and TX connection sets under mu, so the
// shutdown paths can tear connections down (which takes mu itself and
// removes them from the sets) while walking the copies.
func (i *Interface) snapshotConns() ([]*rxConn, []*txConn) {
	i.mu.Lock()
	defer i.mu.Unlock()
	rx := make([]*rxConn, 0, len(i.passive.set))
	for rc := range i.passive.set {
		rx = append(rx, rc)
	}
	return rx, i.active.snapshot()
}

// checkShutdown finishes Close once nothing is left.
func (i *Interface) checkShutdown() {
	r := &i.shut
	if !r.active || r.done == nil {
		return
	}
	i.mu.Lock()
	left := len(i.passive.set)
	i.mu.Unlock()
	left += i.active.count()
	if left == 0 {
		i.finishShutdown()
	}
}

// forceShutdown: the drain did not finish within DrainTimeout (a wedged
// backend, Linux's "RX drain timing out"): destroy what is left.
func (i *Interface) forceShutdown() {
	rx, tx := i.snapshotConns()
	i.log.Warn("drain timed out; forcing", "rx", len(rx), "tx", len(tx))
	for _, rc := range rx {
		i.passive.rxTransition(rc, rxEvForce)
	}
	for _, tc := range tx {
		// Return the credits its unflushed sends hold; late completions
		// then find outstanding at zero and return none.
		if v := tc.outstanding.Swap(0); v > 0 {
			i.tx.returnCredits(int(v))
		}
		i.active.ctr.forced.Add(1)
		tc.destroy()
	}
	i.passive.reaper.flush, i.passive.reaper.drain = nil, nil
	i.finishShutdown()
}

func (i *Interface) finishShutdown() {
	r := &i.shut
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if r.done != nil {
		close(r.done)
		r.done = nil
	}
}
