package cm

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// Request is a received REQ as a listener sees it.
type Request struct {
	ServiceID    uint64
	RemoteGID    hca.GID
	RemoteQPN    hca.QPN
	RemoteCommID uint32
	// StartingPSN is the PSN the requester's receive queue expects; the CM
	// starts this side's send queue there.
	StartingPSN  uint32
	PathMTU      hca.MTU
	RNRRetry     uint8
	RetryCount   uint8
	SRQ          bool
	MaxCMRetries uint8
	// PKey is the REQ's partition and PKeyIndex the index of our table's
	// entry for it: the consumer moves its RC QP to Init with PKeyIndex
	// (ib_cm_init_qp_attr's pkey_index), so both QPs are in the
	// partition the REQ named.
	PKey      hca.PKey
	PKeyIndex int
	// PrivateData is a copy of the REQ's 92 bytes of private data.
	PrivateData []byte
	// Conn is the passive connection, in REQ_RCVD; with Decision.Defer the
	// consumer later calls Conn.Accept or Conn.Reject.
	Conn *Conn
}

// Decision is a listener's answer to a REQ.
type Decision struct {
	// Reject, if non-zero, sends REJ with this reason.
	Reject RejectReason
	// Defer leaves the REQ undecided: duplicate REQs get an MRA until the
	// consumer calls Request.Conn.Accept or Reject. Handler is installed
	// at once.
	Defer bool
	// QP accepts: an RC QP in Init; the CM moves it to RTR (DestQPN and
	// DestGID from the REQ, RQPSN = StartingPSN, PathMTU from the REQ) and
	// RTS (SQPSN = REQ StartingPSN), then sends REP.
	QP hca.QP
	// StartingPSN is the PSN this side's receive queue expects (REP
	// StartingPSN).
	StartingPSN uint32
	// PrivateData goes into the REP (at most 196 bytes).
	PrivateData []byte
	// SRQ sets the REP's SRQ bit: this side receives through an SRQ.
	SRQ bool
	// ResponderResources and InitiatorDepth go into the REP;
	// ipoib_cm_send_rep leaves both 0.
	ResponderResources uint8
	InitiatorDepth     uint8
	// Handler receives the passive connection's events.
	Handler Handler
}

// Listener receives REQs for a set of service IDs.
type Listener struct {
	m          *Manager
	serviceIDs []uint64
	// pkey, if not 0, is the only partition the listener serves (an IPoIB
	// child's); REQs of another are refused before accept sees them.
	pkey   hca.PKey
	accept func(*Request) Decision
	closed bool // guarded by m.mu
}

// Listen registers accept for every ID in serviceIDs (IPoIB listens on
// 0x1000000000000000|UD QPN and 0x0100000000000000|UD QPN). accept runs on
// the Manager's goroutine and must not block. A REQ for a service ID
// nobody listens on is rejected with INVALID_SERVICE_ID. The listener
// takes REQs of every partition in the port's table; see ListenPKey.
func (m *Manager) Listen(serviceIDs []uint64, accept func(req *Request) Decision) (*Listener, error) {
	return m.listen(0, serviceIDs, accept)
}

// ListenPKey is Listen for the REQs of one partition, pkey's (the low 15
// bits; the membership is the port table's business). A REQ for one of
// serviceIDs in another partition is rejected with INVALID_SERVICE_ID:
// nobody listens for that service there. Service IDs stay unique per
// Manager, whatever the partition.
func (m *Manager) ListenPKey(pkey hca.PKey, serviceIDs []uint64, accept func(req *Request) Decision) (*Listener, error) {
	if !pkey.Valid() {
		return nil, fmt.Errorf("cm: listen: P_Key %#04x: %w", uint16(pkey), hca.ErrInvalidArgument)
	}
	return m.listen(pkey, serviceIDs, accept)
}

func (m *Manager) listen(pkey hca.PKey, serviceIDs []uint64, accept func(req *Request) Decision) (*Listener, error) {
	if len(serviceIDs) == 0 || accept == nil {
		return nil, fmt.Errorf("cm: listen: no service IDs or no accept function: %w", hca.ErrInvalidArgument)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return nil, err
	}
	for i, id := range serviceIDs {
		if _, taken := m.listeners[id]; taken {
			return nil, fmt.Errorf("cm: listen on %#016x: %w", id, ErrServiceIDInUse)
		}
		for _, prev := range serviceIDs[:i] {
			if prev == id {
				return nil, fmt.Errorf("cm: listen on %#016x twice: %w", id, ErrServiceIDInUse)
			}
		}
	}
	l := &Listener{m: m, serviceIDs: append([]uint64(nil), serviceIDs...), pkey: pkey, accept: accept}
	for _, id := range serviceIDs {
		m.listeners[id] = l
	}
	return l, nil
}

// ServiceIDs returns the IDs the listener listens on.
func (l *Listener) ServiceIDs() []uint64 { return append([]uint64(nil), l.serviceIDs...) }

// State is StateListening until Close, then StateIdle.
func (l *Listener) State() State {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.closed {
		return StateIdle
	}
	return StateListening
}

// Close stops listening. Connections already accepted are not affected.
func (l *Listener) Close() error {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	for _, id := range l.serviceIDs {
		if m.listeners[id] == l {
			delete(m.listeners, id)
		}
	}
	return nil
}

// handleREQ runs the passive side's REQ processing. It releases m.mu
// while the listener decides. m.mu must be held.
func (m *Manager) handleREQ(r *REQ, src hca.GID) {
	key := remoteKey{r.LocalCommID, src}
	if c := m.byRemote[key]; c != nil {
		if c.tid == r.TransactionID {
			m.stats.reqs[REQDuplicate]++
			m.duplicateREQ(c, r)
			return
		}
		if c.state == StateEstablished {
			// Same comm ID, new transaction: a restarted peer drew the
			// same comm ID. The old connection is stale.
			m.stats.reqs[REQStale]++
			m.staleREQ(c, r, src)
			delete(m.byRemote, key)
			return
		}
		m.stats.reqs[REQUnexpected]++
		m.stats.dropped[DropUnexpected]++
		return
	}
	if old := m.byRemoteQPN[qpnKey{r.LocalQPN, src}]; old != nil {
		// The peer reuses a QPN we think is connected: it restarted, or
		// lost the connection without a DREQ. Refuse the REQ and tell the
		// old connection so the consumer tears it down; its index entry
		// goes now, so the peer's next REQ succeeds (IBTA 12.9.8.3.1).
		m.stats.reqs[REQStale]++
		m.staleREQ(old, r, src)
		return
	}
	l := m.listeners[r.ServiceID]
	if l == nil {
		m.stats.reqs[REQNoListener]++
		m.rejectREQ(r, src, RejectInvalidServiceID)
		return
	}
	if r.TransportServiceType != TransportRC {
		m.stats.reqs[REQBadTransport]++
		m.rejectREQ(r, src, RejectInvalidTransportType)
		return
	}
	pkeyIndex, ok := hca.PKeyIndex(m.pkeys, r.PKey)
	if !ok || !r.PKey.Matches(m.pkeys[pkeyIndex]) {
		// cm_req_handler: cm_init_av_by_path finds no table entry for
		// the path's P_Key (or, stricter than Linux, one the IBTA rule
		// would let no packet through) and the REQ is rejected
		// INVALID_GID with our GID as the additional information.
		m.stats.reqs[REQBadPKey]++
		m.rejectREQInfo(r, src, RejectInvalidGID, m.gid[:])
		return
	}
	if l.pkey != 0 && l.pkey&^0x8000 != r.PKey&^0x8000 {
		m.stats.reqs[REQWrongPartition]++
		m.rejectREQ(r, src, RejectInvalidServiceID)
		return
	}
	if !m.admitHalfOpen(src) {
		m.stats.reqs[REQHalfOpenPerGID]++
		m.rejectREQ(r, src, RejectNoResources)
		return
	}
	m.stats.reqs[REQToListener]++
	c := m.newConn(false, nil)
	c.state = StateREQReceived
	c.tid = r.TransactionID
	c.remoteCommID = r.LocalCommID
	c.remoteGID = src
	c.remoteQPN = r.LocalQPN
	c.serviceID = r.ServiceID
	c.pkey = r.PKey
	c.pathMTU = r.PathMTU
	c.retryCount = r.RetryCount
	c.rnrRetry = r.RNRRetryCount
	c.srq = r.SRQ
	c.reqPSN = r.StartingPSN
	c.maxRetries = min(int(r.MaxCMRetries), m.opts.MaxRetries)
	// cm_req_handler: the REP waits for the RTU as long as the requester
	// said it may take; the QP's ACK timeout and the time-wait are the
	// REQ's Local ACK Timeout (cm_format_paths_from_req, then
	// cm_init_av_by_path add and take away the same 1), within bounds.
	c.respTimeout = convertToMS(peerTimeout(r.LocalCMResponseTimeout))
	c.avTimeout = max(peerTimeout(r.Primary.LocalACKTimeout), 1)
	m.byRemote[key] = c
	m.enterHalfOpen(c)
	req := &Request{
		ServiceID:    r.ServiceID,
		RemoteGID:    src,
		RemoteQPN:    r.LocalQPN,
		RemoteCommID: r.LocalCommID,
		StartingPSN:  r.StartingPSN,
		PathMTU:      r.PathMTU,
		RNRRetry:     r.RNRRetryCount,
		RetryCount:   r.RetryCount,
		SRQ:          r.SRQ,
		MaxCMRetries: r.MaxCMRetries,
		PKey:         r.PKey,
		PKeyIndex:    pkeyIndex,
		PrivateData:  copyBytes(r.PrivateData[:]),
		Conn:         c,
	}
	accept := l.accept
	m.mu.Unlock()
	d := accept(req)
	m.mu.Lock()
	if m.closed || c.state != StateREQReceived {
		return // the Manager closed or the consumer destroyed c meanwhile
	}
	m.applyDecision(c, d)
}

// staleREQ rejects r as STALE_CONN and tells the old connection, whose
// stale-detection entry goes at once so the peer's next REQ succeeds.
// m.mu must be held.
func (m *Manager) staleREQ(old *Conn, r *REQ, src hca.GID) {
	m.stats.staleREQs++
	m.rejectREQ(r, src, RejectStaleConn)
	m.leaveEstablished(old)
	m.queue(Event{Type: EventStale, Conn: old}, nil)
}

// duplicateREQ answers a REQ for a connection already known. m.mu must be
// held.
func (m *Manager) duplicateREQ(c *Conn, r *REQ) {
	m.stats.dupREQs++
	// cm_dup_req_handler: a REQ still being decided is dropped, one whose
	// decision was deferred gets the MRA again, one in time-wait a REJ;
	// in every other state (REP_SENT included: the REP has its own timer)
	// the REQ is old news. To an unverified source it still buys answers
	// (halfopen.go), which the REP's timer may spend.
	if c.halfOpen {
		c.credit += unverifiedMADsPerREQ
	}
	switch c.state {
	case StateREQReceived:
		if !c.deferred {
			return
		}
		mra := MRA{
			TransactionID:  r.TransactionID,
			LocalCommID:    c.localCommID,
			RemoteCommID:   c.remoteCommID,
			MessageMRAed:   RespondsToREQ,
			ServiceTimeout: timeoutCode(m.opts.ResponseTimeout),
		}
		if !m.mayAnswer(c) {
			return
		}
		if err := m.sendMsg(&mra, c.remoteGID, c.pkey); err != nil {
			m.log.Debug("cm: send MRA", "conn", c, "err", err)
		}
	case StateTimeWait:
		m.rejectREQ(r, c.remoteGID, RejectStaleConn)
	}
}

// rejectREQ answers a REQ that has no connection with REJ, in the
// partition the REQ came in. m.mu must be held.
func (m *Manager) rejectREQ(r *REQ, dst hca.GID, reason RejectReason) {
	m.rejectREQInfo(r, dst, reason, nil)
}

// rejectREQInfo is rejectREQ with additional rejection information.
func (m *Manager) rejectREQInfo(r *REQ, dst hca.GID, reason RejectReason, ari []byte) {
	rej := REJ{
		TransactionID:   r.TransactionID,
		RemoteCommID:    r.LocalCommID,
		MessageRejected: RespondsToREQ,
		Reason:          reason,
	}
	rej.RejectInfoLength = uint8(copy(rej.ARI[:], ari))
	if err := m.sendMsg(&rej, dst, m.rxPKey); err != nil {
		m.log.Debug("cm: send REJ", "reason", reason, "err", err)
	}
}

// applyDecision carries out a listener's decision on c (REQ_RCVD).
// m.mu must be held.
func (m *Manager) applyDecision(c *Conn, d Decision) {
	c.handler = d.Handler
	switch {
	case d.Defer:
		c.deferred = true
		return
	case d.Reject != 0:
		m.sendREJ(c, d.Reject, RespondsToREQ)
		m.forget(c)
		return
	case d.QP == nil || len(d.PrivateData) > REPPrivateDataSize:
		m.log.Warn("cm: listener decision without QP or with oversized private data", "conn", c)
		m.sendREJ(c, RejectConsumerDefined, RespondsToREQ)
		m.forget(c)
		return
	}
	c.qp = d.QP
	c.rqPSN = d.StartingPSN & 0xFFFFFF
	if err := m.moveToRTS(c, c.reqPSN); err != nil {
		m.log.Warn("cm: REQ: QP transition failed", "conn", c, "err", err)
		m.sendREJ(c, RejectNoQP, RespondsToREQ)
		m.forget(c)
		return
	}
	rep := REP{
		TransactionID:      c.tid,
		LocalCommID:        c.localCommID,
		RemoteCommID:       c.remoteCommID,
		LocalQPN:           d.QP.QPN(),
		StartingPSN:        c.rqPSN,
		ResponderResources: d.ResponderResources,
		InitiatorDepth:     d.InitiatorDepth,
		TargetACKDelay:     m.ackDelay,
		RNRRetryCount:      c.rnrRetry,
		SRQ:                d.SRQ,
		LocalCAGUID:        m.caGUID,
	}
	copy(rep.PrivateData[:], d.PrivateData)
	c.state = StateREPSent
	m.sendTracked(c, &rep)
}

// handleRTU completes the passive side's handshake. m.mu must be held.
func (m *Manager) handleRTU(r *RTU) {
	c := m.conns[r.RemoteCommID]
	if c == nil || c.active || c.remoteCommID != r.LocalCommID {
		m.stats.dropped[DropUnknownConn]++
		return
	}
	switch c.state {
	case StateREPSent:
		m.establishPassive(c)
	case StateEstablished:
		// NotifyEstablished came first; the RTU is late.
	default:
		m.stats.dropped[DropUnexpected]++
	}
}

// establishPassive moves a passive connection to Established. m.mu must be
// held.
func (m *Manager) establishPassive(c *Conn) {
	m.clearDeadline(c)
	m.leaveHalfOpen(c)
	c.state = StateEstablished
	m.byRemoteQPN[qpnKey{c.remoteQPN, c.remoteGID}] = c
	m.queue(Event{Type: EventEstablished, Conn: c}, nil)
}
