package rocev2

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/internal/core"
)

// cqe is one ring entry; its QP lets Poll count completions of QPs
// already destroyed.
type cqe = core.Entry[*qp]

// cq is a completion queue: a fixed ring of WCs. Producers push under the
// device lock and then cq.mu; Poll and Notify take only cq.mu, so a poller
// never waits on the receive path.
type cq struct {
	dev *Device
	cfg hca.CQConfig

	mu        sync.Mutex
	ring      core.Ring[*qp]
	armed     bool
	destroyed bool

	refs int // QPs using the CQ; guarded by dev.mu
	// held are completions Faults.HoldCompletion keeps out of the ring,
	// oldest first; lastDue is the newest one's release time. Guarded by
	// dev.mu (see hold.go).
	held    []heldCQE
	lastDue time.Time
}

// push delivers q's completion wc, or holds it back behind the CQ's held
// ones (Faults.HoldCompletion); called with dev.mu held.
func (c *cq) push(q *qp, wc *hca.WC) {
	if c.destroyed {
		return
	}
	if len(c.held) > 0 || c.dev.holdDraw() {
		c.hold(cqe{WC: *wc, QP: q})
		return
	}
	c.insert(cqe{WC: *wc, QP: q})
}

// insert appends e to the ring; called with dev.mu held. When the ring is
// full the completion is lost and CQ_ERR raised, as on hardware.
func (c *cq) insert(e cqe) {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return
	}
	if !c.ring.Push(e) {
		c.mu.Unlock()
		c.dev.ctr.cqOverflows.Add(1)
		if c.cfg.OnEvent != nil {
			c.dev.deferEvent(c.cfg.OnEvent, hca.AsyncEvent{Type: hca.EventCQErr})
		}
		return
	}
	fire := c.armed
	c.armed = false
	c.mu.Unlock()
	if fire && c.cfg.OnCompletion != nil {
		c.dev.deferCompletion(c)
	}
}

// Poll moves up to len(into) completions out of the ring. Completions of
// a QP destroyed meanwhile are returned too (IBTA permits it, rxe does
// it) and counted in Stats.CompletionsAfterDestroy: a consumer that drains
// before destroying never sees one.
func (c *cq) Poll(into []hca.WC) int {
	c.mu.Lock()
	k, afterDestroy := c.ring.Poll(into)
	c.mu.Unlock()
	if afterDestroy > 0 {
		c.dev.ctr.completionsAfterDestroy.Add(afterDestroy)
	}
	return k
}

func (c *cq) Notify(reportMissed bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = true
	return reportMissed && c.ring.Len() > 0
}

func (c *cq) Destroy() error {
	d := c.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if c.refs > 0 {
		return fmt.Errorf("rocev2: destroy CQ with %d QPs: %w", c.refs, hca.ErrBusy)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return fmt.Errorf("rocev2: destroy CQ: %w", hca.ErrDestroyed)
	}
	c.destroyed = true
	c.ring.Clear()
	c.dropHeld()
	delete(d.cqs, c)
	return nil
}

// srq is a shared receive queue; guarded by dev.mu.
type srq struct {
	dev       *Device
	cfg       hca.SRQConfig
	ring      core.Queue[hca.RecvWR]
	limit     int // armed limit, 0 = disarmed
	destroyed bool
	refs      int
}

func (s *srq) PostRecv(wrs []hca.RecvWR) (int, error) {
	d := s.dev
	d.mu.Lock()
	defer d.unlock()
	if s.destroyed {
		return 0, fmt.Errorf("rocev2: SRQ post: %w", hca.ErrDestroyed)
	}
	for i := range wrs {
		if s.ring.Full() {
			return i, fmt.Errorf("rocev2: SRQ post %d of %d: %w", i, len(wrs), hca.ErrQueueFull)
		}
		s.ring.Push(wrs[i])
	}
	return len(wrs), nil
}

// take removes the head buffer; called with dev.mu held.
func (s *srq) take() (hca.RecvWR, bool) {
	wr, ok := s.ring.Pop()
	if !ok {
		return hca.RecvWR{}, false
	}
	if s.limit > 0 && s.ring.Len() < s.limit {
		s.limit = 0
		if s.cfg.OnEvent != nil {
			s.dev.deferEvent(s.cfg.OnEvent, hca.AsyncEvent{Type: hca.EventSRQLimitReached})
		}
	}
	return wr, true
}

func (s *srq) ArmLimit(limit int) error {
	s.dev.mu.Lock()
	defer s.dev.unlock()
	if s.destroyed {
		return fmt.Errorf("rocev2: SRQ arm: %w", hca.ErrDestroyed)
	}
	if limit < 0 || limit > s.ring.Cap() {
		return fmt.Errorf("rocev2: SRQ limit %d: %w", limit, hca.ErrInvalidArgument)
	}
	s.limit = limit
	return nil
}

func (s *srq) Posted() int {
	s.dev.mu.Lock()
	defer s.dev.mu.Unlock()
	return s.ring.Len()
}

func (s *srq) Destroy() error {
	s.dev.mu.Lock()
	defer s.dev.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("rocev2: destroy SRQ: %w", hca.ErrDestroyed)
	}
	if s.refs > 0 {
		return fmt.Errorf("rocev2: destroy SRQ with %d QPs: %w", s.refs, hca.ErrBusy)
	}
	s.destroyed = true
	s.dev.srqs--
	return nil
}

// ah is an address handle: just the destination GID, which is also the
// destination IP address.
type ah struct {
	dgid hca.GID
	// group is where multicast sends to dgid go (Config.Multicast).
	group netip.Addr
}

func (a *ah) DGID() hca.GID { return a.dgid }

// Destroy has nothing to release: the handle holds no device resource.
func (a *ah) Destroy() error { return nil }
