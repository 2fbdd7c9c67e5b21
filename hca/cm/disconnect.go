package cm

import (
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// sendDREQ starts a disconnect: a fresh TID, DREQ_SENT, retried on
// timeout. m.mu must be held.
func (m *Manager) sendDREQ(c *Conn) {
	m.leaveEstablished(c)
	c.dreqTID = m.newTID()
	c.state = StateDREQSent
	m.sendTracked(c, &DREQ{
		TransactionID: c.dreqTID,
		LocalCommID:   c.localCommID,
		RemoteCommID:  c.remoteCommID,
		RemoteQPN:     c.remoteQPN,
	})
}

// sendDREP answers a DREQ, reusing its TID. m.mu must be held.
func (m *Manager) sendDREP(r *DREQ, dst hca.GID) {
	drep := DREP{TransactionID: r.TransactionID, LocalCommID: r.RemoteCommID, RemoteCommID: r.LocalCommID}
	if err := m.sendMsg(&drep, dst, m.rxPKey); err != nil {
		m.log.Debug("cm: send DREP", "err", err)
	}
}

// enterTimeWait parks c in time-wait, where it still answers late MADs.
// m.mu must be held.
func (m *Manager) enterTimeWait(c *Conn) {
	m.leaveEstablished(c)
	m.leaveHalfOpen(c)
	c.state = StateTimeWait
	m.setDeadline(c, m.timeWait(c))
}

// timeWait is cm_enter_timewait's wait: the path's ACK timeout, unless
// Options.TimeWait replaces it.
func (m *Manager) timeWait(c *Conn) time.Duration {
	if m.opts.TimeWait > 0 {
		return m.opts.TimeWait
	}
	return convertToMS(c.avTimeout)
}

// handleDREQ answers every DREQ with DREP, like Linux cm_issue_drep, even
// for connections it does not know, so a peer's teardown never waits on
// us. m.mu must be held.
func (m *Manager) handleDREQ(r *DREQ, src hca.GID) {
	c := m.conns[r.RemoteCommID]
	if c == nil || c.remoteCommID != r.LocalCommID || c.remoteGID != src {
		m.stats.unknownDREQs++
		m.sendDREP(r, src)
		return
	}
	switch c.state {
	case StateEstablished, StateREPSent:
		m.sendDREP(r, src)
		m.clearDeadline(c)
		m.enterTimeWait(c)
		m.queue(Event{Type: EventDisconnectRequested, Conn: c, PrivateData: copyBytes(r.PrivateData[:])}, nil)
	case StateDREQSent:
		// Both sides disconnect at once: each DREQ answers the other's.
		m.sendDREP(r, src)
		m.enterTimeWait(c)
		m.queue(Event{Type: EventDisconnected, Conn: c}, nil)
	case StateTimeWait:
		m.sendDREP(r, src) // our DREP was lost
	default:
		m.stats.dropped[DropUnexpected]++
	}
}

// handleDREP completes our disconnect. m.mu must be held.
func (m *Manager) handleDREP(r *DREP) {
	c := m.conns[r.RemoteCommID]
	if c == nil || c.remoteCommID != r.LocalCommID {
		m.stats.dropped[DropUnknownConn]++
		return
	}
	switch c.state {
	case StateDREQSent:
		m.enterTimeWait(c)
		m.queue(Event{Type: EventDisconnected, Conn: c}, nil)
	case StateTimeWait:
		// A DREP for a DREQ resent after its first DREP: nothing to do.
	default:
		m.stats.dropped[DropUnexpected]++
	}
}
