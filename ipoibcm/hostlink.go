package ipoibcm

import (
	"fmt"
	"sync/atomic"
)

// This file is what the engine does when the host sets ib0 down and up
// again (`ip link set ib0 down|up`), as Linux's ipoib_stop and ipoib_open
// do: down stops the queue, tears down every TX and
// passive connection, closes the CM listener so that peers' REQs get
// REJ INVALID_SERVICE_ID from the CM, flushes every neighbour and leaves
// every multicast group; while down nothing is sent on the interface's
// QPs and what still arrives is dropped and counted. Up opens the
// listener again, rejoins the groups the interface had (the broadcast
// group first) and lets the host's frames through; paths and connections
// are made again on demand.

// hostLink is the host's administrative state of ib0 as the engine
// follows it. It changes only in hostLinkTransition, on the control loop;
// the data path, the CM goroutine and Stats read it atomically.
//
//go:generate go tool stringer -type=hostLink -linecomment
type hostLink int32

const (
	// hostLinkUp: the host's ib0 is up; the engine runs normally.
	hostLinkUp hostLink = iota // up
	// hostLinkDown: the host set ib0 down; the engine is stopped as
	// ipoib_stop leaves it, waiting for the host to set it up.
	hostLinkDown // down
)

// hostLinkCell holds the hostLink the engine follows: stored only by
// hostLinkTransition's steps (control loop), loaded by every goroutine.
type hostLinkCell struct{ v atomic.Int32 }

func (c *hostLinkCell) load() hostLink   { return hostLink(c.v.Load()) }
func (c *hostLinkCell) store(l hostLink) { c.v.Store(int32(l)) }

// down reports whether the host has ib0 down (any goroutine).
func (c *hostLinkCell) down() bool { return c.load() == hostLinkDown }

// hostLinkCounters count the downs and ups the engine followed and what
// the downs tore down and flushed.
type hostLinkCounters struct {
	downs, ups                                         atomic.Uint64
	downRXTeardowns, downTXTeardowns, downPathsFlushed atomic.Uint64
}

// hostLinkTransition moves the interface to want (control loop): the one
// place hostLink changes. Asking for the current state does nothing.
func (i *Interface) hostLinkTransition(want hostLink) error {
	from := i.hostLink.load()
	switch {
	case from == hostLinkUp && want == hostLinkDown:
		i.stopForHost()
	case from == hostLinkDown && want == hostLinkUp:
		return i.openForHost()
	}
	return nil
}

// stopForHost is ipoib_stop: from the state change on, the host reader
// drops what the host still hands over (tx_link_down), acceptREQ
// refuses (rx_rejected_down) and UD receives are dropped (rx_link_down);
// then the listener goes, every connection is taken down through its
// normal teardown (DREQ where established, the passive drain), and the
// neighbours' paths and the multicast groups are flushed.
func (i *Interface) stopForHost() {
	// Under the passive set's lock too, which acceptREQ checks the host
	// link under before a connection joins the set: a REQ admitted before
	// is in teardownAll's snapshot below, a later one is refused.
	i.mu.Lock()
	i.passive.mu.Lock()
	i.hostLink.store(hostLinkDown)
	i.passive.mu.Unlock()
	i.mu.Unlock()
	// A frame of the reader's batch may have seen the host up: once the
	// batch is over every frame after it sees the host down, and the
	// connections it may have started are in the set.
	i.tx.windows.quiesce()
	i.link.Store(false)
	i.hostLinkCtr.downs.Add(1)
	i.closeListener()
	rx := i.passive.teardownAll(rxEvHostDown)
	tx := i.active.teardownAll()
	i.hostLinkCtr.downRXTeardowns.Add(uint64(rx))
	i.hostLinkCtr.downTXTeardowns.Add(uint64(tx))
	i.mu.Lock()
	i.neigh.mu.Lock()
	paths := i.neigh.flushPaths(&i.tx)
	i.neigh.mu.Unlock()
	i.hostLinkCtr.downPathsFlushed.Add(uint64(paths))
	groups := i.mcast.leaveAll()
	i.mu.Unlock()
	i.downQuiet = false
	i.log.Info("host set the interface down: stopped", "rx_conns", rx, "tx_conns", tx,
		"paths", paths, "groups", groups)
	i.checkHostDownQuiet()
}

// checkHostDownQuiet logs, once per down, when the last connection of
// the interface is gone (control loop, after every work item): from then
// on the interface sends nothing at all.
func (i *Interface) checkHostDownQuiet() {
	if i.downQuiet || !i.hostLink.down() {
		return
	}
	if i.passive.count()+i.active.count() == 0 {
		i.downQuiet = true
		i.log.Info("host down: every connection is gone")
	}
}

// openForHost is ipoib_open: the listener again, the groups rejoined,
// then the link and the host's frames.
func (i *Interface) openForHost() error {
	if err := i.listen(); err != nil {
		return fmt.Errorf("%s: host set the interface up: %w", i.cfg.Name, err)
	}
	i.mu.Lock()
	// Up first, under mu: attachLocked
	// only records joins while the host has ib0 down.
	i.hostLink.store(hostLinkUp)
	err := i.mcast.rejoin()
	i.mu.Unlock()
	i.hostLinkCtr.ups.Add(1)
	// Without its P_Key in the table the link stays down (onPKeyChange).
	i.link.Store(i.pkeyHere)
	if err != nil {
		i.log.Warn("host set the interface up: rejoin", "err", err)
		return fmt.Errorf("%s: host set the interface up: %w", i.cfg.Name, err)
	}
	i.log.Info("host set the interface up: running")
	return nil
}

// listen opens the CM listener on the IPoIB service IDs of our UD QPN,
// in the interface's partition.
func (i *Interface) listen() error {
	if i.cmm == nil {
		return nil
	}
	qpn := uint64(i.ud.qp.QPN())
	l, err := i.cmm.ListenPKey(i.cfg.PKey, []uint64{serviceIDIETF | qpn, serviceIDRFC | qpn}, i.passive.decideREQ)
	if err != nil {
		return fmt.Errorf("cm listen: %w", err)
	}
	i.listenerMu.Lock()
	i.listener = l
	i.listenerMu.Unlock()
	return nil
}

// closeListener closes the CM listener, if one is open: the CM then
// answers REQs for our service IDs with REJ INVALID_SERVICE_ID.
func (i *Interface) closeListener() {
	i.listenerMu.Lock()
	l := i.listener
	i.listener = nil
	i.listenerMu.Unlock()
	if l != nil {
		l.Close()
	}
}
