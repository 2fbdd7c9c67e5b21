package ipoibcm

import (
	"fmt"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// udQP marks completions of the UD QP (its QPConfig.Context).
type udQP struct{}

// udPath is the UD QP with its receive ring (RFC 4391).
type udPath struct {
	i    *Interface
	qp   hca.QP
	bufs [][]byte // UDRecvQueueSize buffers: headroom + IB MTU
}

// newUDPath creates the UD QP, posts its ring and brings it to RTS. On
// error the QP it created is destroyed again: a live QP would keep both CQs
// busy (the backend refuses to destroy a CQ a QP still uses), so New's
// clean-up could not release them either.
func newUDPath(i *Interface) (_ *udPath, err error) {
	u := &udPath{i: i}
	qp, err := i.dev.CreateQP(hca.QPConfig{
		Type:      hca.QPTypeUD,
		SendCQ:    i.txCQ,
		RecvCQ:    i.rxCQ,
		MaxSendWR: i.cfg.SendQueueSize,
		MaxRecvWR: i.cfg.UDRecvQueueSize,
		Context:   &udQP{},
		OnEvent:   func(ev hca.AsyncEvent) { i.log.Warn("UD QP event", "event", ev.Type) },
	})
	if err != nil {
		return nil, fmt.Errorf("create UD QP: %w", err)
	}
	defer func() {
		if err != nil {
			if derr := qp.Destroy(); derr != nil {
				i.log.Warn("destroy UD QP after failed set-up", "err", derr)
			}
		}
	}()
	u.qp = qp
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: i.pkeyIndex, QKey: frame.QKeyIPoIB}); err != nil {
		return nil, fmt.Errorf("UD QP to Init: %w", err)
	}
	size := headroom + int(i.port.ActiveMTU)
	u.bufs = make([][]byte, i.cfg.UDRecvQueueSize)
	wrs := make([]hca.RecvWR, len(u.bufs))
	for k := range u.bufs {
		b, err := i.dev.Alloc(size)
		if err != nil {
			return nil, fmt.Errorf("UD receive buffer %d: %w", k, err)
		}
		u.bufs[k] = b
		wrs[k] = hca.RecvWR{ID: wrID(wrKindUDRecv, k), Buf: b[headroom:]}
	}
	if n, err := qp.PostRecv(wrs); err != nil || n != len(wrs) {
		return nil, fmt.Errorf("post %d UD receives (%d posted): %w", len(wrs), n, err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateRTR}); err != nil {
		return nil, fmt.Errorf("UD QP to RTR: %w", err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateRTS, SQPSN: i.rng.Uint32() & 0xffffff}); err != nil {
		return nil, fmt.Errorf("UD QP to RTS: %w", err)
	}
	return u, nil
}

func (u *udPath) destroy() {
	if u.qp == nil {
		return
	}
	for mgid, g := range u.i.mcast {
		if g.attached {
			if err := u.qp.DetachMcast(mgid); err != nil {
				u.i.log.Warn("detach multicast", "mgid", mgid, "err", err)
			}
			g.attached = false
		}
	}
	if err := u.qp.Destroy(); err != nil {
		u.i.log.Warn("destroy UD QP", "err", err)
	}
	u.qp = nil
}

// mcastGroup is a multicast group the UD QP sends to or receives from.
type mcastGroup struct {
	ah       hca.AH
	attached bool
}

// joinDefaultGroups attaches the broadcast group (the link comes up only
// after it) and the all-hosts / all-nodes groups every IP host is in.
func (i *Interface) joinDefaultGroups() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if err := i.attachLocked(i.bcast); err != nil {
		return fmt.Errorf("join broadcast group %s: %w", i.bcast, err)
	}
	for _, g := range []netip.Addr{netip.AddrFrom4([4]byte{224, 0, 0, 1}), netip.MustParseAddr("ff02::1")} {
		if err := i.attachLocked(frame.MulticastMGID(g, i.cfg.PKey)); err != nil {
			return fmt.Errorf("join %s: %w", g, err)
		}
	}
	return nil
}

// attachLocked attaches the UD QP to mgid once. The soft fabric has no SA:
// attaching is joining.
func (i *Interface) attachLocked(mgid hca.GID) error {
	g := i.groupLocked(mgid)
	if g.attached {
		return nil
	}
	if err := i.ud.qp.AttachMcast(mgid); err != nil {
		return fmt.Errorf("attach %s: %w", mgid, err)
	}
	g.attached = true
	i.rs.mcastJoins.Add(1)
	return nil
}

func (i *Interface) groupLocked(mgid hca.GID) *mcastGroup {
	g := i.mcast[mgid]
	if g == nil {
		g = &mcastGroup{}
		i.mcast[mgid] = g
	}
	return g
}

// groupAHLocked is the address handle for sends to mgid.
func (i *Interface) groupAHLocked(mgid hca.GID) (hca.AH, error) {
	g := i.groupLocked(mgid)
	if g.ah == nil {
		ah, err := i.dev.CreateAH(mgid)
		if err != nil {
			return nil, fmt.Errorf("address handle for %s: %w", mgid, err)
		}
		g.ah = ah
	}
	return g.ah, nil
}

// neighAHLocked is the address handle for UD sends to neighbour n,
// created on first use and kept until the neighbour is reaped.
func (i *Interface) neighAHLocked(n *neighbour) (hca.AH, error) {
	if n.ah == nil {
		ah, err := i.dev.CreateAH(n.hw.GID())
		if err != nil {
			return nil, fmt.Errorf("address handle for neighbour %s: %w", n.hw, err)
		}
		n.ah = ah
	}
	return n.ah, nil
}

// joinIP attaches the multicast group of IP group address a (seen in a
// host IGMP/MLD report or as a host IPv6 address's solicited-node group).
func (i *Interface) joinIPLocked(a netip.Addr) {
	if !a.IsMulticast() {
		return
	}
	if err := i.attachLocked(frame.MulticastMGID(a, i.cfg.PKey)); err != nil {
		i.log.Warn("multicast join", "group", a, "err", err)
	}
}
