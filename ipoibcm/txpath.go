package ipoibcm

import (
	"errors"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/napi"
)

// txPath is the lower half of the flow host → HCA: the registered buffers
// host frames are sent from, the global TX credits, the one post function
// every send goes through, and the TX completions that give buffers and
// credits back.
//
// Global TX credits (docs/linux.md §6.1): one count of
// sends posted or parked, over the UD QP and every connection. The host
// reader stops reading when the count reaches SendQueueSize-1 and resumes
// when completions bring it down to half, so no per-QP send queue and no
// CQ can overflow, and one stuck peer cannot wedge another's traffic
// forever (the 2008 "never recovers" bug had one stop flag per ring).
type txPath struct {
	i    *Interface
	napi *napi.Context // the TX poller; the host reader busy-polls it
	pool *txPool

	// outstanding counts the credits taken: sends posted or parked.
	outstanding atomic.Int64
	// parkedCredits counts the credits parked frames hold (under
	// Interface.mu); capped by parkedCreditCap so peers that never answer
	// a REQ cannot hold every credit for the CM timeout and stall healthy
	// traffic.
	parkedCredits int
	stopped       atomic.Bool
	wake          chan struct{}
	free          []int // handleTX scratch (TX poller)

	ctr txPathCounters
}

// txPathCounters count the reader's stops and wakes and the ICMP
// too-big answers it built for the host.
type txPathCounters struct {
	stops, wakes, tooBigSent atomic.Uint64
}

// poster posts host frames for one goroutine and owns that goroutine's
// part of the busy-poll duty. The host reader busy-polls the TX CQ (its
// poster has reaps set): while it does, the CQ stays unarmed, and the
// reader hands re-arming back before it blocks. Every other poster (the
// REP handler posting parked frames, the control loop's ARP re-probe)
// hands re-arming back to the TX poller after each post, because the
// reader may be blocked with the CQ unarmed and nothing else would reap
// what it posted. EndBusyPoll never blocks, so this is safe under
// Interface.mu.
type poster struct {
	tx    *txPath
	reaps bool
	wr    [1]hca.SendWR
}

// sendDest is where a send goes: an established connection (tc), or a UD
// destination (address handle and QPN).
type sendDest struct {
	tc  *txConn
	ah  hca.AH
	qpn hca.QPN
}

// post sends pool buffer bufIdx, a host frame of size bytes with its
// Ethernet header, to d, taking one global credit for it. The Ethernet
// header's tail becomes the IPoIB header in place. It reports whether the
// buffer is now the send's; otherwise the failure was counted (and a
// connection that refused the send is torn down).
//
// o asks for offloads: SendIPCsum, or a UD LSO (o.mss) that the HCA cuts
// into o.segs packets. Such a WR takes one credit and one send slot like
// any other; tx_packets and tx_bytes count it once, as Linux counts one
// GSO skb (the offload counters count its packets).
func (p *poster) post(d sendDest, bufIdx, size int, etherType uint16, o sendOffload) bool {
	tx := p.tx
	i := tx.i
	b := tx.pool.bufs[bufIdx]
	frame.PutEncap(b[headroom:], etherType)
	tx.pool.lens[bufIdx] = size - headroom
	qp := i.ud.qp
	if d.tc != nil {
		qp = d.tc.qp
		p.wr[0] = hca.SendWR{ID: wrID(wrKindSend, bufIdx), Data: b[headroom:size], Flags: o.flags}
		d.tc.outstanding.Add(1)
	} else {
		p.wr[0] = hca.SendWR{ID: wrID(wrKindSend, bufIdx), Data: b[headroom:size], Flags: o.flags, MSS: o.mss, AH: d.ah, RemoteQPN: d.qpn, RemoteQKey: frame.QKeyIPoIB}
	}
	tx.outstanding.Add(1)
	n, err := qp.PostSend(p.wr[:])
	if !p.reaps {
		tx.napi.EndBusyPoll()
	}
	if err != nil || n != 1 {
		tx.outstanding.Add(-1)
		i.ctr.txErrors.Add(1)
		if errors.Is(err, hca.ErrLSOTooLarge) {
			i.ctr.drop(dropTxLSOTooLarge)
		} else {
			i.ctr.drop(dropTxPostFailed)
		}
		if d.tc != nil {
			d.tc.outstanding.Add(-1)
			d.tc.sendFailed()
		}
		return false
	}
	if d.tc != nil {
		d.tc.packets.Add(1)
		d.tc.byts.Add(uint64(size - headroom))
	}
	if o.mss > 0 {
		i.off.ctr.txLSOWRs.Add(1)
		i.off.ctr.txLSOPackets.Add(uint64(o.segs))
	} else if o.flags&hca.SendIPCsum != 0 {
		i.off.ctr.txCsumHW.Add(1)
	}
	return true
}

// handleTX is the TX poller's Handle (and the host reader's, when it
// busy-polls): send completions of the UD QP and of every active
// connection give back their pool buffer and their credit. A send error
// other than a flush tears the connection down; the next frame reconnects
// (Linux ipoib_cm_handle_tx_wc).
func (tx *txPath) handleTX(wcs []hca.WC) {
	i := tx.i
	credits := 0
	free := tx.free[:0]
	for k := range wcs {
		wc := &wcs[k]
		if wrKind(wc.ID) != wrKindSend {
			continue
		}
		idx := wrIndex(wc.ID)
		if idx >= len(tx.pool.bufs) {
			continue
		}
		free = append(free, idx)
		ok := wc.Status == hca.StatusSuccess
		if ok {
			i.ctr.txPackets.Add(1)
			i.ctr.txBytes.Add(uint64(tx.pool.lens[idx]))
		} else if wc.Status != hca.StatusWRFlushErr {
			i.ctr.txErrors.Add(1)
			i.ctr.drop(dropTxSendError)
		}
		switch ctx := wc.Context.(type) {
		case *udQP:
			credits++
		case *txConn:
			if ctx.sendDone() {
				credits++
			}
			if !ok {
				if wc.Status == hca.StatusWRFlushErr {
					i.ctr.drop(dropTxNeighFlushed)
				} else {
					ctx.sendFailed()
				}
			}
		default:
			credits++
		}
	}
	tx.pool.put(free...)
	tx.free = free[:0]
	tx.returnCredits(credits)
}

// creditsFree is how many frames the reader may take now.
func (tx *txPath) creditsFree() int {
	return tx.i.cfg.SendQueueSize - int(tx.outstanding.Load())
}

// parkedCreditCap is a quarter of the send queue, but never less than
// one neighbour's worth.
func (tx *txPath) parkedCreditCap() int {
	return max(maxParked, tx.i.cfg.SendQueueSize/4)
}

// returnCredits gives n credits back and wakes the reader if it stopped
// and the count fell to half. Called by the TX poller and by whoever
// drops a parked frame.
func (tx *txPath) returnCredits(n int) {
	if n == 0 {
		return
	}
	tx.wakeIfResumed(tx.outstanding.Add(int64(-n)))
}

// handOverParked passes a parked frame's credit to the send about to be
// posted for it (post takes one), without waking the reader in between.
func (tx *txPath) handOverParked() { tx.outstanding.Add(-1) }

// wakeIfResumed wakes the stopped reader once the count (left) is down
// to half.
func (tx *txPath) wakeIfResumed(left int64) {
	if left <= int64(tx.i.cfg.SendQueueSize/2) && tx.stopped.Load() && tx.stopped.CompareAndSwap(true, false) {
		tx.ctr.wakes.Add(1)
		select {
		case tx.wake <- struct{}{}:
		default:
		}
	}
}

// waitCredits blocks the reader while the queue is stopped, or while
// fewer than reserve credits are free (a super frame the reader may have
// to cut in software needs that many; reserve is at most half the queue,
// where a stopped queue resumes). It returns false when the interface is
// stopping.
func (tx *txPath) waitCredits(reserve int) bool {
	limit := int64(tx.i.cfg.SendQueueSize - max(1, reserve))
	if tx.outstanding.Load() < limit {
		return true
	}
	// Reap what has completed before stopping the queue (the reader
	// busy-polls the TX CQ).
	tx.napi.BusyPoll()
	if tx.outstanding.Load() < limit {
		return true
	}
	tx.ctr.stops.Add(1)
	return tx.stopQueue(stopForCredits)
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
func (tx *txPath) resumable(why stopReason) bool {
	if why == stopForBuffers {
		return tx.pool.available() > 0
	}
	return tx.outstanding.Load() <= int64(tx.i.cfg.SendQueueSize/2)
}

// stopQueue stops the reader until returnCredits wakes it. It returns
// false when the interface is stopping.
//
// The order is what makes the wake-up impossible to lose: completions that
// land before stopped is set do not wake (nobody is stopped yet), so the
// condition is checked again after the store; completions after it find
// stopped and wake. Whoever flips stopped back to false (the re-check here
// or returnCredits) owns the resumption.
func (tx *txPath) stopQueue(why stopReason) bool {
	tx.stopped.Store(true)
	// A stopped queue waits for completion events: hand re-arming back
	// to the TX poller (after stopped is set, so the poll that returns
	// the credits sees it and wakes us).
	tx.napi.EndBusyPoll()
	if tx.resumable(why) && tx.stopped.CompareAndSwap(true, false) {
		return true
	}
	for {
		select {
		case <-tx.wake:
			if !tx.stopped.Load() {
				return true
			}
		case <-tx.i.stop:
			return false
		}
	}
}
