package ipoibcm

import (
	"errors"
	"net"
	"time"

	"github.com/ipoibcm/ipoib/hca"
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
// and sent (txFrameLocked, txframe.go) and stops reading while TX credits
// or buffers are exhausted. It holds Interface.mu once per batch, not per
// frame.
//
// It also reaps send completions itself after each batch (napi BusyPoll),
// as mlx4/mlx5 reap TX completions in the transmit path: on the soft
// fabric a send usually completes inside PostSend, so the TX poller's
// goroutine is never woken for it. While it busy-polls the TX CQ stays
// unarmed; the reader hands re-arming back (EndBusyPoll) whenever it may
// block with sends outstanding, so a completion is never left unnoticed.
func (i *Interface) hostReader() {
	defer i.readerWG.Done()
	tx := &i.tx
	defer tx.napi.EndBusyPoll() // the TX poller reaps whatever is left
	t := &txScratch{}
	t.init(tx, max(1, i.host.BatchSize()))
	for {
		if !tx.waitCredits(i.off.segReserve) {
			return
		}
		want := min(len(t.idx), max(1, tx.creditsFree()))
		if r := i.off.segReserve; r > 0 {
			// Each frame may be a super frame to cut in software.
			want = min(want, max(1, tx.creditsFree()/r))
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
		if op := i.off.port; op != nil {
			got, err = op.ReadFramesMeta(t.bufs[:n], t.sizes[:n], t.meta[:n])
		} else {
			got, err = i.host.ReadFrames(t.bufs[:n], t.sizes[:n])
		}
		if err != nil {
			tx.pool.put(t.idx[:n]...)
			select {
			case <-i.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			i.log.Warn("host read", "err", err)
			continue
		}
		got = min(got, n)
		now := time.Now()
		t.free = t.free[:0]
		t.replies = t.replies[:0]
		i.mu.Lock()
		i.neigh.mu.Lock()
		for k := range got {
			t.pending = got - 1 - k
			if !i.txFrameLocked(t, t.idx[k], t.sizes[k], t.meta[k], now) {
				t.free = append(t.free, t.idx[k])
			}
		}
		i.neigh.mu.Unlock()
		i.mu.Unlock()
		t.free = append(t.free, t.idx[got:n]...)
		tx.pool.put(t.free...)
		if len(t.replies) > 0 {
			i.hostOut.write(t.replies)
		}
		if got > 0 {
			tx.napi.BusyPoll()
		}
	}
}
