package cm

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// ConnectParams describe an active connection.
type ConnectParams struct {
	DestGID   hca.GID
	ServiceID uint64
	// QP is an RC QP in Init. On REP the CM moves it to RTR (DestQPN = REP
	// LocalQPN, RQPSN = StartingPSN) and RTS (SQPSN = REP StartingPSN).
	QP hca.QP
	// StartingPSN is the REQ StartingPSN: the PSN this side's receive
	// queue expects (Linux IPoIB sends 0).
	StartingPSN uint32
	// PrivateData goes into the REQ (at most 92 bytes).
	PrivateData []byte
	PathMTU     hca.MTU
	// RetryCount and RNRRetry go into the REQ and into both QPs: the
	// passive side takes them from the REQ, RNR retry back through the
	// REP (ipoib_cm_send_rep), as cm_init_qp_rts_attr applies them.
	RetryCount uint8 // 0..7
	RNRRetry   uint8 // 0..7
	// ResponderResources and InitiatorDepth are the RDMA read/atomic
	// depths of the REQ (ipoib_cm_send_req asks for 4 and 0).
	ResponderResources uint8
	InitiatorDepth     uint8
	SRQ                bool
	// PKey is the connection's partition; 0 means the port table's
	// entry 0. The REQ's Partition Key carries the table's entry for it
	// (the membership the subnet manager gave this port, as the QP's
	// BTH will), and every MAD of the connection goes out with that
	// entry's index. QP must be in Init with the same index.
	PKey hca.PKey
}

// Connect sends a REQ for p and returns the new connection in REQ_SENT.
// Its events go to h.
func (m *Manager) Connect(p ConnectParams, h Handler) (*Conn, error) {
	switch {
	case p.QP == nil:
		return nil, fmt.Errorf("cm: connect: no QP: %w", hca.ErrInvalidArgument)
	case p.QP.Type() != hca.QPTypeRC:
		return nil, fmt.Errorf("cm: connect: %s QP: %w", p.QP.Type(), hca.ErrInvalidArgument)
	case p.QP.State() != hca.QPStateInit:
		return nil, fmt.Errorf("cm: connect: QP in %s, want INIT: %w", p.QP.State(), hca.ErrInvalidArgument)
	case len(p.PrivateData) > REQPrivateDataSize:
		return nil, fmt.Errorf("cm: connect: %d bytes of private data: %w", len(p.PrivateData), ErrPrivateDataSize)
	case !p.PathMTU.Valid():
		return nil, fmt.Errorf("cm: connect: path MTU %d: %w", p.PathMTU, hca.ErrInvalidArgument)
	case p.RetryCount > 7 || p.RNRRetry > 7:
		return nil, fmt.Errorf("cm: connect: retry %d, RNR retry %d: %w", p.RetryCount, p.RNRRetry, hca.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return nil, err
	}
	pkey := p.PKey
	if pkey == 0 {
		pkey = m.pkeys[0]
	}
	idx, ok := hca.PKeyIndex(m.pkeys, pkey)
	if !ok {
		return nil, fmt.Errorf("cm: connect: P_Key %#04x not in the port's table %#04x: %w", uint16(pkey), m.pkeys, hca.ErrInvalidArgument)
	}
	c := m.newConn(true, h)
	c.pkey = m.pkeys[idx]
	c.remoteGID = p.DestGID
	c.serviceID = p.ServiceID
	c.qp = p.QP
	c.tid = m.newTID()
	c.pathMTU = p.PathMTU
	c.retryCount = p.RetryCount
	c.rnrRetry = p.RNRRetry
	c.srq = p.SRQ
	c.reqPSN = p.StartingPSN & 0xFFFFFF
	c.rqPSN = c.reqPSN
	c.maxRetries = m.opts.MaxRetries
	code := timeoutCode(m.opts.ResponseTimeout)
	plt := m.opts.PacketLifeTime
	// ib_send_cm_req and cm_init_av_by_path.
	c.respTimeout = 2*convertToMS(plt) + convertToMS(code)
	c.avTimeout = min(plt+1, 31)
	req := REQ{
		TransactionID:           c.tid,
		LocalCommID:             c.localCommID,
		ServiceID:               p.ServiceID,
		LocalCAGUID:             m.caGUID,
		LocalQPN:                p.QP.QPN(),
		ResponderResources:      p.ResponderResources,
		InitiatorDepth:          p.InitiatorDepth,
		RemoteCMResponseTimeout: code,
		TransportServiceType:    TransportRC,
		StartingPSN:             c.reqPSN,
		LocalCMResponseTimeout:  code,
		RetryCount:              p.RetryCount,
		PKey:                    c.pkey,
		PathMTU:                 p.PathMTU,
		RNRRetryCount:           p.RNRRetry,
		MaxCMRetries:            uint8(m.opts.MaxRetries),
		SRQ:                     p.SRQ,
		Primary: Path{
			LocalLID:        lidPermissive,
			RemoteLID:       lidPermissive,
			LocalGID:        m.gid,
			RemoteGID:       p.DestGID,
			HopLimit:        hopLimit,
			SubnetLocal:     hopLimit <= 1,
			LocalACKTimeout: ackTimeout(m.ackDelay, plt),
		},
	}
	copy(req.PrivateData[:], p.PrivateData)
	c.state = StateREQSent
	m.sendTracked(c, &req)
	return c, nil
}

// handleREP runs the active side's REP processing: QP to RTR and RTS, then
// EventREPReceived, then (after the handler) RTU. m.mu must be held.
func (m *Manager) handleREP(r *REP, src hca.GID) {
	c := m.conns[r.RemoteCommID]
	if c == nil || !c.active || c.remoteGID != src {
		m.stats.dropped[DropUnknownConn]++
		return
	}
	switch c.state {
	case StateREQSent:
	case StateEstablished:
		// Our RTU was lost and the peer resent its REP.
		if r.LocalCommID == c.remoteCommID {
			m.sendRTU(c)
			return
		}
		m.stats.dropped[DropUnexpected]++
		return
	default:
		m.stats.dropped[DropUnexpected]++
		return
	}
	m.clearDeadline(c)
	c.remoteCommID = r.LocalCommID
	c.remoteQPN = r.LocalQPN
	// cm_rep_handler: the QP retries RNR as the REP says and times out
	// after the peer's ACK delay on top of the path's life time.
	c.rnrRetry = r.RNRRetryCount
	c.avTimeout = ackTimeout(peerTimeout(r.TargetACKDelay), c.avTimeout-1)
	if err := m.moveToRTS(c, r.StartingPSN); err != nil {
		m.log.Warn("cm: REP: QP transition failed", "conn", c, "err", err)
		c.localRejected = true
		m.sendREJ(c, RejectConsumerDefined, RespondsToREP)
		m.enterTimeWait(c)
		m.queue(Event{Type: EventRejected, Conn: c, RejectReason: RejectConsumerDefined, Err: err}, nil)
		return
	}
	c.state = StateREPReceived
	m.queue(Event{Type: EventREPReceived, Conn: c, PrivateData: copyBytes(r.PrivateData[:])},
		func() { m.finishREP(c) })
}

// finishREP sends RTU, or REJ if the handler called Reject, once the
// EventREPReceived handler returned.
func (m *Manager) finishREP(c *Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || c.state != StateREPReceived {
		return
	}
	if c.rejectAtREP != 0 {
		m.sendREJ(c, c.rejectAtREP, RespondsToREP)
		m.enterTimeWait(c)
		return
	}
	m.sendRTU(c)
	c.state = StateEstablished
	m.queue(Event{Type: EventEstablished, Conn: c}, nil)
}

func (m *Manager) sendRTU(c *Conn) {
	rtu := RTU{TransactionID: c.tid, LocalCommID: c.localCommID, RemoteCommID: c.remoteCommID}
	if err := m.sendMsg(&rtu, c.remoteGID, c.pkey); err != nil {
		m.log.Debug("cm: send RTU", "conn", c, "err", err)
	}
}

// moveToRTS moves c's QP to RTR then RTS with the peer's QPN, the PSNs
// the two CM messages announced and the timers and retry counts they
// agreed (cm_init_qp_rtr_attr, cm_init_qp_rts_attr).
func (m *Manager) moveToRTS(c *Conn, sqPSN uint32) error {
	if err := c.qp.Modify(hca.QPAttr{
		State:       hca.QPStateRTR,
		DestQPN:     c.remoteQPN,
		DestGID:     c.remoteGID,
		RQPSN:       c.rqPSN,
		PathMTU:     c.pathMTU,
		MinRNRTimer: minRNRTimer,
	}); err != nil {
		return fmt.Errorf("QP %d to RTR: %w", c.qp.QPN(), err)
	}
	if err := c.qp.Modify(hca.QPAttr{
		State:      hca.QPStateRTS,
		SQPSN:      sqPSN & 0xFFFFFF,
		Timeout:    c.avTimeout,
		RetryCount: c.retryCount,
		RNRRetry:   c.rnrRetry,
	}); err != nil {
		return fmt.Errorf("QP %d to RTS: %w", c.qp.QPN(), err)
	}
	return nil
}
