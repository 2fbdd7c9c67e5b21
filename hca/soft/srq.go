package soft

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/internal/core"
)

// recvQueue is a receive queue (a QP's own RQ or an SRQ) plus the RC
// senders parked on it waiting for a buffer (RNR retry 7).
type recvQueue struct {
	wrs     core.Queue[hca.RecvWR]
	waiters []*qp
}

// srq is a soft shared receive queue.
type srq struct {
	f   *Fabric
	dev *Device
	cfg hca.SRQConfig

	// Guarded by f.mu.
	rq        recvQueue
	limit     int // armed limit; 0 = disarmed
	users     int
	destroyed bool
}

var _ hca.SRQ = (*srq)(nil)

// CreateSRQ makes an SRQ of cfg.MaxWR buffers.
func (d *Device) CreateSRQ(cfg hca.SRQConfig) (hca.SRQ, error) {
	if cfg.MaxWR <= 0 || cfg.MaxWR > maxSRQWR {
		return nil, fmt.Errorf("soft: %s: create SRQ of %d WRs: %w", d.name, cfg.MaxWR, hca.ErrInvalidArgument)
	}
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("soft: %s: create SRQ: %w", d.name, hca.ErrDestroyed)
	}
	s := &srq{f: f, dev: d, cfg: cfg, rq: recvQueue{wrs: core.NewQueue[hca.RecvWR](cfg.MaxWR)}}
	d.srqs[s] = struct{}{}
	f.live.srqs++
	return s, nil
}

// PostRecv posts receive buffers and wakes senders waiting for one.
func (s *srq) PostRecv(wrs []hca.RecvWR) (int, error) {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.destroyed {
		return 0, fmt.Errorf("soft: SRQ post recv: %w", hca.ErrDestroyed)
	}
	for i := range wrs {
		if !s.rq.wrs.Push(wrs[i]) {
			f.wakeWaiters(&s.rq)
			return i, fmt.Errorf("soft: SRQ post recv %d of %d: %w", i, len(wrs), hca.ErrQueueFull)
		}
	}
	f.wakeWaiters(&s.rq)
	return len(wrs), nil
}

// ArmLimit arms SRQ_LIMIT_REACHED for when fewer than limit buffers remain.
func (s *srq) ArmLimit(limit int) error {
	if limit < 0 || limit > s.cfg.MaxWR {
		return fmt.Errorf("soft: SRQ arm limit %d of %d: %w", limit, s.cfg.MaxWR, hca.ErrInvalidArgument)
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("soft: SRQ arm limit: %w", hca.ErrDestroyed)
	}
	s.limit = limit
	return nil
}

// Posted is the number of buffers posted and not yet consumed.
func (s *srq) Posted() int {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return s.rq.wrs.Len()
}

// Destroy frees the SRQ; it fails with ErrBusy while QPs use it.
func (s *srq) Destroy() error {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("soft: destroy SRQ: %w", hca.ErrDestroyed)
	}
	if s.users > 0 {
		return fmt.Errorf("soft: destroy SRQ used by %d QPs: %w", s.users, hca.ErrBusy)
	}
	f.destroySRQLocked(s)
	return nil
}

func (f *Fabric) destroySRQLocked(s *srq) {
	s.destroyed = true
	s.rq.wrs.Clear()
	s.rq.waiters = nil
	delete(s.dev.srqs, s)
	f.live.srqs--
}

// takeRecv consumes the next receive buffer of r (from its SRQ if it has
// one) and fires the SRQ limit event; under f.mu.
func (f *Fabric) takeRecv(r *qp) (hca.RecvWR, bool) {
	if r.srq == nil {
		return f.popRecv(&r.rq)
	}
	s := r.srq
	wr, ok := f.popRecv(&s.rq)
	if ok && s.limit > 0 && s.rq.wrs.Len() < s.limit {
		s.limit = 0
		f.event(s.cfg.OnEvent, hca.AsyncEvent{Type: hca.EventSRQLimitReached})
	}
	return wr, ok
}

// wakeWaiters lets RC senders parked on rq try again, oldest first; under
// f.mu.
func (f *Fabric) wakeWaiters(rq *recvQueue) {
	if len(rq.waiters) == 0 {
		return
	}
	ws := rq.waiters
	rq.waiters = nil
	for i, s := range ws {
		ws[i] = nil
		if s.destroyed.Load() || s.sendState != sendBufferWait || s.waitingOn != rq {
			continue
		}
		s.sendState = sendReady
		s.waitingOn = nil
		f.progressSends(s)
	}
	if rq.waiters == nil {
		rq.waiters = ws[:0]
	}
}

// popRecv takes the buffer the next message lands in, per
// Config.ReceiveOrder; under f.mu.
func (f *Fabric) popRecv(rq *recvQueue) (hca.RecvWR, bool) {
	if f.cfg.ReceiveOrder == ReceiveNewestFirst {
		return rq.wrs.PopNewest()
	}
	return rq.wrs.Pop()
}
