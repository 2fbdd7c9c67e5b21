package ipoibcm

import (
	"fmt"
	"log/slog"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// srqRing is the shared receive queue every passive RC connection receives
// into: RecvQueueSize buffers of 65524 bytes (IPOIB_CM_BUF_SIZE).
type srqRing struct {
	log  *slog.Logger
	srq  hca.SRQ
	bufs [][]byte
}

// newSRQRing creates the SRQ and posts its buffers; on error it destroys
// the SRQ again, so New's clean-up finds nothing of it left.
func newSRQRing(i *Interface) (_ *srqRing, err error) {
	s := &srqRing{log: i.log}
	srq, err := i.dev.CreateSRQ(hca.SRQConfig{MaxWR: i.cfg.RecvQueueSize})
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
	s.bufs = make([][]byte, i.cfg.RecvQueueSize)
	wrs := make([]hca.RecvWR, len(s.bufs))
	for k := range s.bufs {
		b, err := i.dev.Alloc(headroom + frame.CMBufSize)
		if err != nil {
			return nil, fmt.Errorf("SRQ buffer %d: %w", k, err)
		}
		s.bufs[k] = b
		wrs[k] = hca.RecvWR{ID: wrID(wrKindSRQRecv, k), Buf: b[headroom:]}
	}
	if n, err := srq.PostRecv(wrs); err != nil || n != len(wrs) {
		return nil, fmt.Errorf("post %d SRQ receives (%d posted): %w", len(wrs), n, err)
	}
	return s, nil
}

func (s *srqRing) recvWR(idx int) hca.RecvWR {
	return hca.RecvWR{ID: wrID(wrKindSRQRecv, idx), Buf: s.bufs[idx][headroom:]}
}

func (s *srqRing) destroy() {
	if s.srq == nil {
		return
	}
	if err := s.srq.Destroy(); err != nil {
		s.log.Warn("destroy SRQ", "err", err)
	}
	s.srq = nil
}
