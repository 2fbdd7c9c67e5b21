package ipoibcm

import (
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// txScratch is the host reader's reusable state.
type txScratch struct {
	idx   []int
	bufs  [][]byte
	sizes []int
	meta  []offload.Meta // per frame; all zero from a plain HostPort
	free  []int
	// pending is how many frames of the batch follow the one being
	// sent: software segmentation leaves each of them a credit.
	pending int
	// segIdx and segLen are software segmentation's pool buffers and
	// the segments' lengths.
	segIdx []int
	segLen []int
	plain  txMeta // a segment's (zero) metadata
	post   poster // reaps: the reader busy-polls the TX CQ
	nd     []byte // ND rewrite scratch

	// replies are frames for the host made while reading (ICMP too-big).
	replyBufs [][]byte
	replies   [][]byte
}

const replyBufSize = 1536 // an ICMPv6 packet-too-big quotes up to 1280 bytes

func (t *txScratch) init(tx *txPath, batch int) {
	t.idx = make([]int, batch)
	t.bufs = make([][]byte, batch)
	t.sizes = make([]int, batch)
	t.meta = make([]offload.Meta, batch)
	t.segIdx = make([]int, hca.MaxLSOSegments)
	t.segLen = make([]int, hca.MaxLSOSegments)
	t.free = make([]int, 0, batch)
	t.post = poster{tx: tx, reaps: true}
	t.nd = make([]byte, txBufSize)
	t.replyBufs = make([][]byte, batch)
	for k := range t.replyBufs {
		t.replyBufs[k] = make([]byte, replyBufSize)
	}
	t.replies = make([][]byte, 0, batch)
}

// replyBuf returns a free reply buffer, nil if the batch used them all.
func (t *txScratch) replyBuf() []byte {
	if len(t.replies) == len(t.replyBufs) {
		return nil
	}
	return t.replyBufs[len(t.replies)]
}

// hostReader is the start of the flow host → HCA: it reads batches of
// Ethernet frames from the host into TX pool buffers, has each translated
// and sent (frame, txframe.go) and stops reading while TX credits or
// buffers are exhausted. It holds no lock across a post or a host write:
// each frame is resolved under the owners' locks (the neighbour table's,
// the multicast table's) in short sections and posted after them; what a
// batch resolved stays valid until the batch ends (sendWindow).
//
// It also reaps send completions itself after each batch (napi BusyPoll),
// as mlx4/mlx5 reap TX completions in the transmit path: on the soft
// fabric a send usually completes inside PostSend, so the TX poller's
// goroutine is never woken for it. While it busy-polls the TX CQ stays
// unarmed; the reader hands re-arming back (EndBusyPoll) whenever it may
// block with sends outstanding, so a completion is never left unnoticed.
type hostReader struct {
	host    HostPort
	off     *offloadPath
	tx      *txPath
	neigh   *neighbourTable
	conns   *activeSet
	mcast   *mcastTable
	hostOut *hostWriter
	ctr     *counters
	stop    <-chan struct{}
	log     *slog.Logger

	// What the interface is, fixed at Start: our hardware address, the
	// broadcast group, the partition, the UD MTU, whether there is a CM.
	hw    frame.HWAddr
	bcast hca.GID
	pkey  hca.PKey
	udMTU int
	cm    bool
	// What the interface decides and the reader follows: the mode, the
	// IP MTU, the host's ib0 state.
	mode     *atomic.Int32
	mtu      *atomic.Int64
	hostDown func() bool

	t txScratch
}

// newHostReader hands the host reader what it works with, from the
// interface it reads for (Start); it keeps no pointer to it.
func newHostReader(i *Interface) *hostReader {
	r := &hostReader{
		host: i.host, off: &i.off, tx: &i.tx, neigh: &i.neigh, conns: &i.active, mcast: &i.mcast,
		hostOut: &i.hostOut, ctr: &i.ctr, stop: i.stop, log: i.log,
		hw: i.hw, bcast: i.bcast, pkey: i.cfg.PKey, udMTU: i.udMTU, cm: i.cmm != nil,
		mode: &i.mode, mtu: &i.mtu, hostDown: i.hostDown,
	}
	r.t.init(&i.tx, max(1, i.host.BatchSize()))
	return r
}

// run is the reader's goroutine.
func (r *hostReader) run(done func()) {
	defer done()
	tx := r.tx
	defer tx.napi.EndBusyPoll() // the TX poller reaps whatever is left
	t := &r.t
	for {
		if !tx.waitCredits(r.off.segReserve) {
			return
		}
		want := min(len(t.idx), max(1, tx.creditsFree()))
		if rs := r.off.segReserve; rs > 0 {
			// Each frame may be a super frame to cut in software.
			want = min(want, max(1, tx.creditsFree()/rs))
		}
		n := tx.pool.take(t.idx[:want])
		if n == 0 {
			if tx.napi.BusyPoll() > 0 {
				continue // completions gave buffers back
			}
			// Every buffer is in flight: wait for completions like for
			// credits, with the TX CQ armed.
			if !tx.stopQueue(stopForBuffers) {
				return
			}
			continue
		}
		for k := range n {
			t.bufs[k] = tx.pool.bufs[t.idx[k]]
		}
		if tx.outstanding.Load() > 0 {
			// The read may block: completions still to come need the
			// completion event.
			tx.napi.EndBusyPoll()
		}
		var got int
		var err error
		if op := r.off.port; op != nil {
			got, err = op.ReadFramesMeta(t.bufs[:n], t.sizes[:n], t.meta[:n])
		} else {
			got, err = r.host.ReadFrames(t.bufs[:n], t.sizes[:n])
		}
		if err != nil {
			tx.pool.put(t.idx[:n]...)
			select {
			case <-r.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("host read", "err", err)
			continue
		}
		got = min(got, n)
		now := time.Now()
		t.free = t.free[:0]
		t.replies = t.replies[:0]
		tx.window.enter()
		for k := range got {
			t.pending = got - 1 - k
			if !r.frame(t.idx[k], t.sizes[k], t.meta[k], now) {
				t.free = append(t.free, t.idx[k])
			}
		}
		tx.window.leave()
		t.free = append(t.free, t.idx[got:n]...)
		tx.pool.put(t.free...)
		if len(t.replies) > 0 {
			r.hostOut.write(t.replies)
		}
		if got > 0 {
			tx.napi.BusyPoll()
		}
	}
}
