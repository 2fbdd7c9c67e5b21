package ipoibcm

import (
	"fmt"
	"log/slog"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// udQP marks completions of the UD QP (its QPConfig.Context).
type udQP struct{}

// udPath is the UD QP with its receive ring (RFC 4391).
type udPath struct {
	qp   hca.QP
	bufs [][]byte // UDRecvQueueSize buffers: headroom + IB MTU
	log  *slog.Logger
	// psn draws the send queue's starting PSN from the interface's
	// source, which the CM goroutine draws from too.
	psn func() uint32
}

// newUDPath creates the UD QP and its ring, and brings it to RTS if the
// interface's P_Key is in the port's table (else activate does, once it
// is). On error the QP it created is destroyed again: a live QP would keep
// both CQs busy (the backend refuses to destroy a CQ a QP still uses), so
// New's clean-up could not release them either.
func newUDPath(i *Interface) (_ *udPath, err error) {
	u := &udPath{log: i.log, psn: i.psn.next}
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
	size := headroom + int(i.port.ActiveMTU)
	u.bufs = make([][]byte, i.cfg.UDRecvQueueSize)
	for k := range u.bufs {
		b, err := i.dev.Alloc(size)
		if err != nil {
			return nil, fmt.Errorf("UD receive buffer %d: %w", k, err)
		}
		u.bufs[k] = b
	}
	if i.pkeyActive {
		if err := u.activate(i.pkeyIndex); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// activate moves the UD QP from Reset to RTS on P_Key index pkeyIndex
// with every ring buffer posted: at New, or once the P_Key appears.
func (u *udPath) activate(pkeyIndex int) error {
	qp := u.qp
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: pkeyIndex, QKey: frame.QKeyIPoIB}); err != nil {
		return fmt.Errorf("UD QP to Init: %w", err)
	}
	wrs := make([]hca.RecvWR, len(u.bufs))
	for k, b := range u.bufs {
		wrs[k] = hca.RecvWR{ID: wrID(wrKindUDRecv, k), Buf: b[headroom:]}
	}
	if n, err := qp.PostRecv(wrs); err != nil || n != len(wrs) {
		return fmt.Errorf("post %d UD receives (%d posted): %w", len(wrs), n, err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateRTR}); err != nil {
		return fmt.Errorf("UD QP to RTR: %w", err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateRTS, SQPSN: u.psn()}); err != nil {
		return fmt.Errorf("UD QP to RTS: %w", err)
	}
	return nil
}

func (u *udPath) destroy() {
	if u.qp == nil {
		return
	}
	if err := u.qp.Destroy(); err != nil {
		u.log.Warn("destroy UD QP", "err", err)
	}
	u.qp = nil
}
