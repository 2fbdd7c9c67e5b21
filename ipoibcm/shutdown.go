package ipoibcm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Shutdown: Close stops the host reader, then takes every connection
// through its normal teardown on the control loop (shutdown.begin), bounded
// by DrainTimeout (shutdown.force), then stops the pollers and the control
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
	st := i.life.load()
	switch st {
	case ifClosed:
		return i.closeErr
	case ifCreated:
		i.life.store(ifClosed)
		i.destroyResources()
		i.closeErr = i.host.Close()
		return i.closeErr
	}
	i.life.store(ifClosing)
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
	i.ctl.post(func() { i.shut.begin(done) })
	<-done

	i.rxNAPI.Stop()
	i.tx.napi.Stop()
	i.ctl.stop()
	i.destroyResources()
	i.life.store(ifClosed)
	if hostErr != nil && !errors.Is(hostErr, errAlreadyClosed) {
		i.closeErr = fmt.Errorf("%s: close host port: %w", i.cfg.Name, hostErr)
	}
	i.log.Info("closed")
	return i.closeErr
}

var errAlreadyClosed = errors.New("already closed")

// shutdown is Close's part on the control loop: whether it began, whom
// to tell when it is done, and the DrainTimeout that forces it. It owns no
// connection: it asks the passive set and the active connections to take
// theirs down, and waits until both are empty.
type shutdown struct {
	active bool
	done   chan struct{}
	timer  *time.Timer

	drainTimeout time.Duration
	rx           *passiveSet
	tx           activeConns
	log          *slog.Logger
}

// activeConns is what shutdown (and the host's link down) needs of the
// active connections' owner (activeSet, txconn.go).
type activeConns interface {
	// teardownAll starts every active connection's teardown (control
	// loop) and says how many there were.
	teardownAll() int
	// forceAll destroys every active connection left, handing back the
	// credits their unflushed sends hold, and says how many.
	forceAll() int
	// count is how many active connections are left, closing included.
	count() int
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
	i.tx.windows.close()
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

// begin tears everything down through the normal protocol (control
// loop); done closes when all is reaped or DrainTimeout forced the rest.
func (sd *shutdown) begin(done chan struct{}) {
	sd.active = true
	sd.done = done
	sd.timer = time.NewTimer(sd.drainTimeout)
	sd.rx.teardownAll(rxEvShutdown)
	sd.tx.teardownAll()
}

// deadline is the DrainTimeout's channel once Close began, nil before
// (the control loop's select then never picks it).
func (sd *shutdown) deadline() <-chan time.Time {
	if sd.timer == nil {
		return nil
	}
	return sd.timer.C
}

// check finishes Close once no connection is left (control loop, after
// every work item).
func (sd *shutdown) check() {
	if !sd.active || sd.done == nil {
		return
	}
	if sd.rx.count()+sd.tx.count() == 0 {
		sd.finish()
	}
}

// force: the drain did not finish within DrainTimeout (a wedged backend,
// Linux's "RX drain timing out"): destroy what is left.
func (sd *shutdown) force() {
	sd.log.Warn("drain timed out; forcing", "rx", sd.rx.count(), "tx", sd.tx.count())
	sd.rx.forceAll()
	sd.tx.forceAll()
	sd.finish()
}

func (sd *shutdown) finish() {
	if sd.timer != nil {
		sd.timer.Stop()
		sd.timer = nil
	}
	if sd.done != nil {
		close(sd.done)
		sd.done = nil
	}
}

// snapshotSet copies a connection set under the lock that guards it, so
// a teardown (which takes the lock itself and removes the connection from
// the set) can walk the copy.
func snapshotSet[C comparable](mu *sync.Mutex, set map[C]struct{}) []C {
	mu.Lock()
	defer mu.Unlock()
	out := make([]C, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	return out
}
