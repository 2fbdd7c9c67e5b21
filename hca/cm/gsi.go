package cm

import (
	"errors"
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// setupGSI creates the CQ, the GSI QP (QP1) and its buffers, and posts the
// receive buffers.
func (m *Manager) setupGSI() error {
	depth := m.opts.QueueDepth
	var err error
	if m.sendBuf, err = m.dev.Alloc(depth * MADSize); err != nil {
		return fmt.Errorf("cm: alloc send buffers: %w", err)
	}
	if m.recvBuf, err = m.dev.Alloc(depth * recvSlotSize); err != nil {
		return fmt.Errorf("cm: alloc receive buffers: %w", err)
	}
	m.cq, err = m.dev.CreateCQ(hca.CQConfig{Size: 2 * depth, OnCompletion: m.kick})
	if err != nil {
		return fmt.Errorf("cm: create GSI CQ: %w", err)
	}
	m.qp, err = m.dev.CreateQP(hca.QPConfig{
		Type:      hca.QPTypeGSI,
		SendCQ:    m.cq,
		RecvCQ:    m.cq,
		MaxSendWR: depth,
		MaxRecvWR: depth,
		Context:   m,
	})
	if err != nil {
		return fmt.Errorf("cm: create GSI QP: %w", err)
	}
	for _, a := range []hca.QPAttr{
		{State: hca.QPStateInit, PKeyIndex: 0, QKey: hca.QKeyGSI},
		{State: hca.QPStateRTR},
		{State: hca.QPStateRTS},
	} {
		if err := m.qp.Modify(a); err != nil {
			return fmt.Errorf("cm: GSI QP to %s: %w", a.State, err)
		}
	}
	m.freeSlots = make([]uint32, depth)
	for i := range m.freeSlots {
		m.freeSlots[i] = uint32(depth - 1 - i)
	}
	m.recvWRs = make([]hca.RecvWR, 0, depth)
	m.slotPKey = make([]hca.PKey, depth)
	m.backlog = newBacklog(depth)
	for i := 0; i < depth; i++ {
		m.recvWRs = append(m.recvWRs, hca.RecvWR{ID: uint64(i), Buf: m.recvSlot(i)})
	}
	if err := m.postRecvs(); err != nil {
		return err
	}
	m.cq.Notify(false)
	return nil
}

func (m *Manager) teardownGSI() error {
	var errs []error
	errs = append(errs, m.ahs.destroyAll())
	if m.qp != nil {
		errs = append(errs, m.qp.Destroy())
		m.qp = nil
	}
	if m.cq != nil {
		errs = append(errs, m.cq.Destroy())
		m.cq = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cm: tear down GSI QP: %w", err)
	}
	return nil
}

func (m *Manager) recvSlot(i int) []byte {
	return m.recvBuf[i*recvSlotSize : (i+1)*recvSlotSize]
}

// postRecvs posts the receive buffers collected in m.recvWRs.
func (m *Manager) postRecvs() error {
	wrs := m.recvWRs
	for len(wrs) > 0 {
		n, err := m.qp.PostRecv(wrs)
		if err != nil {
			m.recvWRs = m.recvWRs[:0]
			return fmt.Errorf("cm: post GSI receives: %w", err)
		}
		if n == 0 {
			break
		}
		wrs = wrs[n:]
	}
	m.recvWRs = m.recvWRs[:0]
	return nil
}

// pollCQ drains the CQ into the backlog, serves a few queued MADs between
// polls so the receive queue never runs dry while the CM works, and
// re-arms once both are empty, polling again when completions slipped in
// before the arm (the missed-event report).
func (m *Manager) pollCQ() {
	for {
		n := m.cq.Poll(m.wcs)
		for i := range m.wcs[:n] {
			m.takeWC(&m.wcs[i])
		}
		m.serveBacklog(backlogServe)
		if len(m.recvWRs) > 0 {
			if err := m.postRecvs(); err != nil {
				m.log.Error("cm: repost receives", "err", err)
			}
		}
		if n == len(m.wcs) || m.backlog.held > 0 {
			continue
		}
		if !m.cq.Notify(true) {
			return
		}
	}
}

// takeWC retires a send slot, or queues a received MAD in the backlog
// (backlog.go); what is not queued goes back to the receive queue.
func (m *Manager) takeWC(wc *hca.WC) {
	switch wc.Opcode {
	case hca.WCSend:
		m.mu.Lock()
		m.freeSlots = append(m.freeSlots, uint32(wc.ID))
		m.ahs.sendDone()
		if wc.Status != hca.StatusSuccess {
			m.stats.sendErrors++
		}
		m.mu.Unlock()
	case hca.WCRecv:
		slot := int(wc.ID)
		if slot < 0 || slot >= m.opts.QueueDepth {
			return
		}
		if wc.Status == hca.StatusSuccess && m.backlog.push(wc.SrcGID, slot, min(max(wc.ByteLen, 0), recvSlotSize)) {
			m.slotPKey[slot] = wc.PKey
			return
		}
		m.recvWRs = append(m.recvWRs, hca.RecvWR{ID: wc.ID, Buf: m.recvSlot(slot)})
		m.mu.Lock()
		switch wc.Status {
		case hca.StatusSuccess:
			m.stats.dropped[DropBacklog]++
		case hca.StatusWRFlushErr:
		default:
			m.stats.dropped[DropRecvError]++
		}
		m.mu.Unlock()
	}
}

// serveBacklog handles up to max queued MADs, one source after another,
// and hands their slots back to the receive queue.
func (m *Manager) serveBacklog(max int) {
	for range max {
		src, slot, n, ok := m.backlog.pop()
		if !ok {
			return
		}
		buf := m.recvSlot(slot)
		m.mu.Lock()
		m.handleMAD(buf[:n], src, m.slotPKey[slot])
		m.mu.Unlock()
		m.recvWRs = append(m.recvWRs, hca.RecvWR{ID: uint64(slot), Buf: buf})
	}
}

// handleMAD decodes one MAD, received with P_Key pkey, into the run
// goroutine's scratch messages and hands it to its state machine. m.mu
// must be held.
func (m *Manager) handleMAD(b []byte, src hca.GID, pkey hca.PKey) {
	m.rxPKey = pkey
	h, err := checkMAD(b)
	if err == nil {
		var msg Message
		switch MsgType(h.AttributeID) {
		case MsgREQ:
			msg = &m.rx.req
		case MsgREP:
			msg = &m.rx.rep
		case MsgRTU:
			msg = &m.rx.rtu
		case MsgREJ:
			msg = &m.rx.rej
		case MsgMRA:
			msg = &m.rx.mra
		case MsgDREQ:
			msg = &m.rx.dreq
		case MsgDREP:
			msg = &m.rx.drep
		default:
			err = fmt.Errorf("attribute %#04x: %w", h.AttributeID, ErrAttribute)
		}
		if err == nil {
			err = msg.Unmarshal(b)
		}
	}
	if err != nil {
		m.stats.dropped[dropReasonOf(err)]++
		m.log.Debug("cm: dropped MAD", "src", src, "err", err)
		return
	}
	m.stats.received[msgIndex(MsgType(h.AttributeID))]++
	switch MsgType(h.AttributeID) {
	case MsgREQ:
		m.handleREQ(&m.rx.req, src)
	case MsgREP:
		m.handleREP(&m.rx.rep, src)
	case MsgRTU:
		m.handleRTU(&m.rx.rtu)
	case MsgREJ:
		m.handleREJ(&m.rx.rej, src)
	case MsgMRA:
		m.handleMRA(&m.rx.mra)
	case MsgDREQ:
		m.handleDREQ(&m.rx.dreq, src)
	case MsgDREP:
		m.handleDREP(&m.rx.drep)
	}
}

// sendMsg marshals msg into the scratch buffer and sends it to dgid in
// partition pkey. m.mu must be held.
func (m *Manager) sendMsg(msg Message, dgid hca.GID, pkey hca.PKey) error {
	if err := msg.Marshal(m.scratch[:]); err != nil {
		return err
	}
	return m.sendRaw(m.scratch[:], msg.Type(), dgid, pkey)
}

// sendRaw copies a marshalled MAD into a free send slot and posts it to
// the peer's GSI QP, with the P_Key index of partition pkey in our table
// (cm_init_av_by_path's ib_find_cached_pkey). Failures are counted; the
// caller's retry timer, if any, covers them. m.mu must be held.
func (m *Manager) sendRaw(mad []byte, t MsgType, dgid hca.GID, pkey hca.PKey) error {
	if m.closed {
		return ErrClosed
	}
	pkeyIndex, ok := hca.PKeyIndex(m.pkeys, pkey)
	if !ok {
		m.stats.sendErrors++
		return fmt.Errorf("cm: send %s: P_Key %#04x not in the port's table: %w", t, uint16(pkey), hca.ErrInvalidArgument)
	}
	if len(m.freeSlots) == 0 {
		m.stats.sendErrors++
		return fmt.Errorf("cm: send %s: %w", t, hca.ErrQueueFull)
	}
	ahe := m.ahs.lookup(dgid)
	if ahe == nil {
		ah, err := m.createAH(dgid)
		if err != nil {
			m.stats.sendErrors++
			return err
		}
		ahe = m.ahs.insert(dgid, ah)
	}
	slot := m.freeSlots[len(m.freeSlots)-1]
	buf := m.sendBuf[int(slot)*MADSize : (int(slot)+1)*MADSize]
	copy(buf, mad)
	m.sendWR[0] = hca.SendWR{ID: uint64(slot), Data: buf, AH: ahe.ah, RemoteQPN: hca.QPNGSI, RemoteQKey: hca.QKeyGSI, PKeyIndex: pkeyIndex}
	n, err := m.qp.PostSend(m.sendWR[:])
	m.sendWR[0] = hca.SendWR{}
	if err != nil || n != 1 {
		m.stats.sendErrors++
		if err == nil {
			err = hca.ErrQueueFull
		}
		return fmt.Errorf("cm: send %s to %s: %w", t, dgid, err)
	}
	m.freeSlots = m.freeSlots[:len(m.freeSlots)-1]
	m.ahs.sent(ahe)
	m.stats.sent[msgIndex(t)]++
	if t == MsgREJ {
		// The reason sits at MAD offset 24+10.
		m.stats.rejSent[RejectReason(uint16(mad[34])<<8|uint16(mad[35]))]++
	}
	return nil
}

// createAH makes the address handle the cache (m.ahs, bounded by
// maxCachedAHs) keeps for dgid. m.mu must be held.
func (m *Manager) createAH(dgid hca.GID) (hca.AH, error) {
	ah, err := m.dev.CreateAH(dgid)
	if err != nil {
		return nil, fmt.Errorf("cm: address handle for %s: %w", dgid, err)
	}
	return ah, nil
}
