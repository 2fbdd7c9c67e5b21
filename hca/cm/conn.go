package cm

import (
	"fmt"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// Conn is one CM connection (a cm_id in Linux terms), active or passive.
// Its methods are safe from any goroutine, handlers included.
type Conn struct {
	m       *Manager
	active  bool
	handler Handler // nil after Destroy: no more events

	// Guarded by m.mu.
	state        State
	localCommID  uint32
	remoteCommID uint32
	remoteGID    hca.GID
	remoteQPN    hca.QPN
	serviceID    uint64
	// pkey is the connection's partition: the REQ's Partition Key. Its
	// MADs go out with its index in our table.
	pkey    hca.PKey
	qp      hca.QP
	tid     uint64 // of the REQ and everything that answers it
	dreqTID uint64

	// Path parameters: the active side's from ConnectParams, the passive
	// side's from the REQ.
	pathMTU    hca.MTU
	retryCount uint8
	rnrRetry   uint8
	srq        bool
	reqPSN     uint32 // StartingPSN of the REQ
	rqPSN      uint32 // the PSN our receive queue expects
	maxRetries int
	// respTimeout is how long a REQ, REP or DREQ waits for its answer
	// before it is resent (Linux cm_id_priv->timeout_ms).
	respTimeout time.Duration
	// avTimeout is Linux cm_av.timeout: the path's packet life time + 1
	// until the REP tells the active side the peer's ACK delay, then the
	// local ACK timeout of the QP; its time-wait too.
	avTimeout uint8
	// deferred: the listener left the REQ undecided, so a duplicate REQ
	// gets an MRA (Linux MRA_REQ_SENT) instead of being dropped.
	deferred      bool
	reqPrivate    []byte // passive: REQ private data, for a deferred decision
	rejectAtREP   RejectReason
	localRejected bool // the CM rejected a REP it could not apply

	// Retransmission: the last REQ, REP or DREQ, resent on timeout.
	retx      [MADSize]byte
	retxType  MsgType
	retries   int
	deadline  time.Time
	heapIndex int

	// Half-open bookkeeping (halfopen.go): set from the REQ until the
	// peer is verified; credit is the MADs we may still send it.
	halfOpen    bool
	halfOpenSeq uint64
	credit      int
}

func (m *Manager) newConn(active bool, h Handler) *Conn {
	c := &Conn{m: m, active: active, handler: h, heapIndex: -1}
	c.localCommID = m.newLocalCommID()
	m.conns[c.localCommID] = c
	return c
}

// State returns the connection's CM state.
func (c *Conn) State() State {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.state
}

// Active reports whether this side sent the REQ.
func (c *Conn) Active() bool { return c.active }

// RemoteQPN is the peer's RC QPN (from the REP or the REQ).
func (c *Conn) RemoteQPN() hca.QPN {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.remoteQPN
}

// RemoteGID is the peer's GID.
func (c *Conn) RemoteGID() hca.GID { return c.remoteGID }

// PKey is the connection's partition, as its REQ carried it.
func (c *Conn) PKey() hca.PKey { return c.pkey }

// ServiceID is the service ID of the REQ.
func (c *Conn) ServiceID() uint64 { return c.serviceID }

// LocalCommID is this side's communication ID.
func (c *Conn) LocalCommID() uint32 { return c.localCommID }

// RemoteCommID is the peer's communication ID (0 until known).
func (c *Conn) RemoteCommID() uint32 {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.remoteCommID
}

func (c *Conn) String() string {
	side := "passive"
	if c.active {
		side = "active"
	}
	return fmt.Sprintf("cm %s %#08x<->%#08x %s", side, c.localCommID, c.remoteCommID, c.remoteGID)
}

// NotifyEstablished tells a passive connection that its QP received
// something: the RTU was lost or is late, but the peer clearly has it
// (IBTA 12.9.7, ib_cm_notify IB_EVENT_COMM_EST). A no-op in other states.
func (c *Conn) NotifyEstablished() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if !c.active && c.state == StateREPSent && !m.closed {
		m.establishPassive(c)
	}
}

// Disconnect sends a DREQ (retried like a REQ). The handler then sees
// EventDisconnected and, after time-wait, EventTimeWaitExit.
func (c *Conn) Disconnect() error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return err
	}
	if c.state != StateEstablished {
		return fmt.Errorf("disconnect %v in %s: %w", c, c.state, ErrInvalidState)
	}
	m.sendDREQ(c)
	return nil
}

// Reject refuses the connection. Inside the EventREPReceived handler it
// makes the CM send REJ instead of RTU (the QP is the consumer's to reset);
// on a passive connection whose decision was deferred it answers the REQ
// with REJ.
func (c *Conn) Reject(reason RejectReason) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return err
	}
	if reason == 0 {
		reason = RejectConsumerDefined
	}
	switch {
	case c.active && c.state == StateREPReceived:
		c.rejectAtREP = reason
		return nil
	case !c.active && c.state == StateREQReceived:
		m.sendREJ(c, reason, RespondsToREQ)
		m.forget(c)
		return nil
	}
	return fmt.Errorf("reject %v in %s: %w", c, c.state, ErrInvalidState)
}

// Accept applies a decision deferred by the listener (Decision.Defer).
func (c *Conn) Accept(d Decision) error {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkOpen(); err != nil {
		return err
	}
	if c.active || c.state != StateREQReceived || d.Defer {
		return fmt.Errorf("accept %v in %s: %w", c, c.state, ErrInvalidState)
	}
	m.applyDecision(c, d)
	return nil
}

// Destroy forgets the connection: no further events reach its handler.
// Like ib_destroy_cm_id, an established connection first sends a DREQ
// (still retried in the background), a pending REQ is answered with REJ
// TIMEOUT and a pending REP or undecided REQ with REJ CONSUMER_DEFINED.
func (c *Conn) Destroy() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	c.handler = nil
	if m.closed {
		return
	}
	switch c.state {
	case StateREQSent:
		m.sendREJTimeout(c, RespondsToOther)
		m.forget(c)
	case StateREQReceived:
		m.sendREJ(c, RejectConsumerDefined, RespondsToREQ)
		m.forget(c)
	case StateREPSent:
		m.sendREJ(c, RejectConsumerDefined, RespondsToOther)
		m.forget(c)
	case StateREPReceived:
		c.rejectAtREP = RejectConsumerDefined
	case StateEstablished:
		m.sendDREQ(c)
	}
	// StateDREQSent and StateTimeWait run out on their own, silently.
}

// onTimeout runs when c's deadline passed. m.mu must be held.
func (m *Manager) onTimeout(c *Conn) {
	switch c.state {
	case StateREQSent, StateREPSent, StateDREQSent:
		if c.retries < c.maxRetries {
			if !m.mayAnswer(c) {
				// The unverified source spent its budget: end the
				// handshake without another MAD toward it.
				m.stats.unverifiedGiveUps++
				m.forget(c)
				m.queue(Event{Type: EventTimedOut, Conn: c}, nil)
				return
			}
			c.retries++
			m.stats.retries++
			if err := m.sendRaw(c.retx[:], c.retxType, c.remoteGID, c.pkey); err != nil {
				m.log.Debug("cm: resend", "conn", c, "err", err)
			}
			m.setDeadline(c, c.respTimeout)
			return
		}
		m.stats.timeouts++
		switch c.state {
		case StateREQSent, StateREPSent:
			// Like cm_process_send_error: back to idle and an error
			// event, nothing on the wire; the peer's own timer ends
			// its side.
			m.forget(c)
			m.queue(Event{Type: EventTimedOut, Conn: c}, nil)
		case StateDREQSent:
			m.enterTimeWait(c)
			m.queue(Event{Type: EventDisconnected, Conn: c}, nil)
		}
	case StateTimeWait:
		m.forget(c)
		m.queue(Event{Type: EventTimeWaitExit, Conn: c}, nil)
	}
}

// sendTracked marshals msg into c's retransmission buffer, sends it and
// arms the response timer with a fresh retry budget. m.mu must be held.
func (m *Manager) sendTracked(c *Conn, msg Message) {
	if err := msg.Marshal(c.retx[:]); err != nil {
		// Only reachable through a programming error: every field is
		// validated before.
		m.log.Error("cm: marshal", "conn", c, "err", err)
		return
	}
	c.retxType = msg.Type()
	c.retries = 0
	if !m.mayAnswer(c) {
		m.setDeadline(c, m.opts.ResponseTimeout)
		return
	}
	if err := m.sendRaw(c.retx[:], c.retxType, c.remoteGID, c.pkey); err != nil {
		m.log.Debug("cm: send", "conn", c, "err", err)
	}
	m.setDeadline(c, c.respTimeout)
}
