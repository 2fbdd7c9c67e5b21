package soak

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// churnRig measures the passive side alone: one Interface on a soft fabric
// and a bare IPoIB-CM peer (a CM manager and RC QPs, no Interface) that
// opens connections to it the way a Linux peer would, sends over them and
// closes them. The reap, memory and churn benchmarks use it.
type churnRig struct {
	fab   *soft.Fabric
	ifc   *ipoibcm.Interface
	host  *soakHost
	flows *soakFlows
	viol  soakViolations
	peer  *cmPeer
}

// churnRigConfig sizes a rig: slots are the peer's concurrent connection
// attempts (each slot is one soak flow, so its packets stay in order).
type churnRigConfig struct {
	slots         int
	recvQueueSize int
	staleAfter    time.Duration
}

func newChurnRig(rc churnRigConfig) (_ *churnRig, err error) {
	r := &churnRig{fab: soft.NewFabric(soft.Config{Seed: 1, TimerScale: 0.01})}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	dev, err := r.fab.NewDevice("passive")
	if err != nil {
		return nil, fmt.Errorf("churn rig: %w", err)
	}
	r.flows = newSoakFlows(rc.slots + 1)
	r.host = newSoakHost(0, 8, 64, r.flows, &r.viol)
	stale := rc.staleAfter
	if stale <= 0 {
		stale = time.Hour
	}
	r.ifc, err = ipoibcm.New(ipoibcm.Config{
		Device: dev, Host: r.host, Name: "ib0", Mode: ipoibcm.ModeConnected,
		SendQueueSize: 64, RecvQueueSize: rc.recvQueueSize,
		CM:         cm.Options{ResponseTimeout: 200 * time.Millisecond, PacketLifeTime: 1, MaxRetries: 3, TimeWait: time.Millisecond, Seed: 1},
		StaleAfter: stale, StaleScan: min(stale/4, time.Second), StaleUpdate: stale / 2,
		DrainTimeout: 10 * time.Second,
		// The rig's one peer GID stands for many hosts: it opens a
		// connection per cycle while earlier ones are still being reaped,
		// which the per-GID passive limit (meant for one real peer) would
		// refuse with REJ NO_QP.
		MaxRXConnsPerGID: 1 << 16,
	})
	if err != nil {
		r.host.Close()
		return nil, fmt.Errorf("churn rig: %w", err)
	}
	if err := r.ifc.Start(); err != nil {
		return nil, fmt.Errorf("churn rig: %w", err)
	}
	r.peer, err = newCMPeer(r.fab, rc.slots)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (r *churnRig) close() {
	if r.ifc != nil {
		r.ifc.Close()
	}
	if r.peer != nil {
		r.peer.close()
	}
	r.fab.Close()
}

// cmPeer is the active side of the rig.
type cmPeer struct {
	dev  *soft.Device
	cmm  *cm.Manager
	cq   hca.CQ
	msgs [][]byte // one registered send buffer per slot

	// sendErrors counts sends that failed (RNR retries exhausted when the
	// passive SRQ ran dry): the peer's tx_send_error.
	sendErrors atomic.Uint64

	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

const cmPeerUDQPN hca.QPN = 0x4242 // what the peer claims as its UD QPN

func newCMPeer(fab *soft.Fabric, slots int) (*cmPeer, error) {
	dev, err := fab.NewDevice("active")
	if err != nil {
		return nil, fmt.Errorf("cm peer: %w", err)
	}
	p := &cmPeer{dev: dev, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	p.cq, err = dev.CreateCQ(hca.CQConfig{Size: 1 << 16, OnCompletion: func() { signal(p.wake) }})
	if err != nil {
		return nil, fmt.Errorf("cm peer CQ: %w", err)
	}
	p.cmm, err = cm.NewManager(dev, cm.Options{ResponseTimeout: 200 * time.Millisecond, PacketLifeTime: 1, MaxRetries: 3, TimeWait: time.Millisecond, Seed: 2})
	if err != nil {
		return nil, fmt.Errorf("cm peer manager: %w", err)
	}
	for range slots {
		b, err := dev.Alloc(frame.EncapLen + 256)
		if err != nil {
			return nil, fmt.Errorf("cm peer buffer: %w", err)
		}
		p.msgs = append(p.msgs, b)
	}
	p.wg.Add(1)
	go p.pollCQ()
	return p, nil
}

// pollCQ counts the peer's failed sends (nothing to recycle: each slot
// sends one message per connection).
func (p *cmPeer) pollCQ() {
	defer p.wg.Done()
	wcs := make([]hca.WC, 64)
	for {
		for n := p.cq.Poll(wcs); n > 0; n = p.cq.Poll(wcs) {
			for k := range wcs[:n] {
				if wcs[k].Status != hca.StatusSuccess {
					p.sendErrors.Add(1)
				}
			}
		}
		if p.cq.Notify(true) {
			continue
		}
		select {
		case <-p.wake:
		case <-p.stop:
			return
		}
	}
}

func (p *cmPeer) close() {
	close(p.stop)
	p.wg.Wait()
	if p.cmm != nil {
		p.cmm.Close()
	}
	p.dev.Close()
}

// peerConn is one connection of the peer.
type peerConn struct {
	qp     hca.QP
	conn   *cm.Conn
	events chan cm.Event
}

var errPeerConnect = errors.New("cm peer: connection not established")

// open connects to the Interface whose hardware address is dst. With
// send, the REP handler posts the slot's message (a soak packet of flow
// slot+1 -> 0, sequence seq) before the RTU, as IPoIB does with parked
// packets.
func (p *cmPeer) open(dst frame.HWAddr, slot int, seq uint64, flows *soakFlows, send bool) (*peerConn, error) {
	qp, err := p.dev.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: p.cq, RecvCQ: p.cq, MaxSendWR: 2, MaxRecvWR: 1})
	if err != nil {
		return nil, fmt.Errorf("cm peer QP: %w", err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit}); err != nil {
		qp.Destroy()
		return nil, fmt.Errorf("cm peer QP to Init: %w", err)
	}
	pc := &peerConn{qp: qp, events: make(chan cm.Event, 4)}
	priv := make([]byte, 8)
	binary.BigEndian.PutUint32(priv[0:4], uint32(cmPeerUDQPN))
	binary.BigEndian.PutUint32(priv[4:8], frame.CMBufSize)
	msg := p.msgs[slot]
	handler := func(ev cm.Event) {
		if ev.Type == cm.EventREPReceived && send {
			n := frame.EncapLen + 64
			frame.PutEncap(msg, frame.EtherTypeIPv4)
			putSoakIPv4(msg[frame.EncapLen:], uint16(slot+1), 0, seq, n-frame.EncapLen)
			flows.sent(slot+1, 0)
			wr := [1]hca.SendWR{{ID: uint64(slot), Data: msg[:n]}}
			qp.PostSend(wr[:])
		}
		select {
		case pc.events <- ev:
		default:
		}
	}
	pc.conn, err = p.cmm.Connect(cm.ConnectParams{
		DestGID: dst.GID(), ServiceID: 0x1000000000000000 | uint64(dst.QPN()), QP: qp,
		PrivateData: priv, PathMTU: hca.MTU4096, SRQ: false,
	}, handler)
	if err != nil {
		qp.Destroy()
		return nil, fmt.Errorf("cm peer connect: %w", err)
	}
	return pc, nil
}

// waitEstablished waits for the RTU to have left (EventEstablished).
func (pc *peerConn) waitEstablished(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev := <-pc.events:
			switch ev.Type {
			case cm.EventEstablished:
				return nil
			case cm.EventRejected, cm.EventTimedOut:
				return fmt.Errorf("%w: %s", errPeerConnect, ev.Type)
			}
		case <-t.C:
			return fmt.Errorf("%w: no answer in %s", errPeerConnect, timeout)
		}
	}
}

// close disconnects (DREQ: the passive side tears down) and frees the QP.
func (pc *peerConn) close() {
	pc.conn.Destroy()
	pc.qp.Destroy()
}
