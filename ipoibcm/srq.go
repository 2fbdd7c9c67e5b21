package ipoibcm

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// srqRing is the shared receive queue every passive RC connection receives
// into: buffers of 65524 bytes (IPOIB_CM_BUF_SIZE), RecvQueueSize of them
// at first (Linux's 256), growing up to MaxRecvQueueSize under load.
//
// Why it grows: RC over an SRQ has no end-to-end flow control. A send
// completes once it lands in a posted buffer, so a sender outruns a
// receiver whose host write is slower than its peer's host read, and the
// SRQ then holds everything the host's TCP has in flight. One TCP stream
// keeps fewer than 256 segments of 64 KiB in flight (tcp_rmem bounds its
// window in bytes), eight streams keep more; and the peer's REQ asks for
// RNR retry 0 (ipoib_cm_send_req, docs/linux.md), so the first receive that
// finds the SRQ empty fails the peer's QP: a teardown, a new connection and
// the frames parked meanwhile lost. Linux leaves the remedy to the
// administrator (ib_ipoib recv_queue_size); the SRQ limit event does it
// here: when fewer than half the buffers remain posted, the control loop
// doubles them, so the SRQ settles at the size the load needs and no
// larger, within a bound (docs/decisions.md, "The SRQ grows").
type srqRing struct {
	log  *slog.Logger
	dev  hca.Device
	srq  hca.SRQ
	post func(func()) // the control loop, where growth runs
	// bufs has room for the largest size; bufs[k] is written before its
	// receive is posted and read by the RX path only after that receive
	// completed, so the SRQ's own lock orders the two.
	bufs  [][]byte
	size  atomic.Int32  // buffers allocated and given to the SRQ
	grown atomic.Uint64 // limit events that added buffers
	// destroyed is Close's: srq stays set, so Stats may still read a
	// destroyed SRQ's count (0) while Close runs.
	destroyed bool
}

// newSRQRing creates the SRQ and posts its first buffers; on error it
// destroys the SRQ again, so New's clean-up finds nothing of it left.
func newSRQRing(i *Interface) (_ *srqRing, err error) {
	s := &srqRing{log: i.log, dev: i.dev, post: i.ctl.post, bufs: make([][]byte, i.cfg.MaxRecvQueueSize)}
	srq, err := i.dev.CreateSRQ(hca.SRQConfig{MaxWR: i.cfg.MaxRecvQueueSize, OnEvent: s.onEvent})
	if err != nil {
		return nil, fmt.Errorf("create SRQ: %w", err)
	}
	defer func() {
		if err != nil {
			if derr := srq.Destroy(); derr != nil {
				i.log.Warn("destroy SRQ after failed set-up", "err", derr)
			}
		}
	}()
	s.srq = srq
	if err := s.add(i.cfg.RecvQueueSize); err != nil {
		return nil, err
	}
	return s, nil
}

// add allocates and posts n more buffers and re-arms the limit event at
// half the new size, unless the SRQ is at its largest.
func (s *srqRing) add(n int) error {
	from := int(s.size.Load())
	wrs := make([]hca.RecvWR, n)
	for k := range wrs {
		b, err := s.dev.Alloc(headroom + frame.CMBufSize)
		if err != nil {
			return fmt.Errorf("SRQ buffer %d: %w", from+k, err)
		}
		s.bufs[from+k] = b
		wrs[k] = s.recvWR(from + k)
	}
	if posted, err := s.srq.PostRecv(wrs); err != nil || posted != n {
		return fmt.Errorf("post %d SRQ receives (%d posted): %w", n, posted, err)
	}
	size := from + n
	s.size.Store(int32(size))
	if size < len(s.bufs) {
		if err := s.srq.ArmLimit(size / 2); err != nil {
			return fmt.Errorf("arm the SRQ limit at %d: %w", size/2, err)
		}
	}
	return nil
}

// onEvent runs where the backend delivers async events: the soft
// fabric's dispatcher, which LAST_WQE_REACHED waits behind, or after a
// RoCEv2 device's lock is released, on its receive loop or in a poster's
// verb call. Allocating a doubling there would stall them, so the growth
// is handed to the control loop.
func (s *srqRing) onEvent(ev hca.AsyncEvent) {
	if ev.Type == hca.EventSRQLimitReached {
		s.post(s.grow)
	}
}

// grow doubles the buffers, up to the largest size; on the control loop.
func (s *srqRing) grow() {
	size := int(s.size.Load())
	n := min(size, len(s.bufs)-size)
	if n == 0 {
		return
	}
	if err := s.add(n); err != nil {
		// The SRQ keeps what it had; the limit stays disarmed, so a
		// failing allocation is not retried at every receive.
		s.log.Warn("grow the SRQ", "from", size, "err", err)
		return
	}
	s.grown.Add(1)
	s.log.Debug("SRQ grown", "from", size, "to", size+n)
}

func (s *srqRing) recvWR(idx int) hca.RecvWR {
	return hca.RecvWR{ID: wrID(wrKindSRQRecv, idx), Buf: s.bufs[idx][headroom:]}
}

// destroy runs once, from Close, after the control loop (and so grow)
// has stopped.
func (s *srqRing) destroy() {
	if s.destroyed {
		return
	}
	s.destroyed = true
	if err := s.srq.Destroy(); err != nil {
		s.log.Warn("destroy SRQ", "err", err)
	}
}
