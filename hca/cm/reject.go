package cm

import (
	"encoding/binary"

	"github.com/ipoibcm/ipoib/hca"
)

// sendREJ rejects c's current transaction. m.mu must be held.
func (m *Manager) sendREJ(c *Conn, reason RejectReason, rejected MsgResponse) {
	if !m.mayAnswer(c) {
		return
	}
	rej := REJ{
		TransactionID:   c.tid,
		LocalCommID:     c.localCommID,
		RemoteCommID:    c.remoteCommID,
		MessageRejected: rejected,
		Reason:          reason,
	}
	if err := m.sendMsg(&rej, c.remoteGID, c.pkey); err != nil {
		m.log.Debug("cm: send REJ", "conn", c, "reason", reason, "err", err)
	}
}

// sendREJTimeout sends REJ TIMEOUT with our CA GUID as the additional
// rejection information, as cm_destroy_id does for a REQ still pending:
// the peer may not know our comm ID yet and finds the connection by
// (our comm ID, our GID). m.mu must be held.
func (m *Manager) sendREJTimeout(c *Conn, rejected MsgResponse) {
	if !m.mayAnswer(c) {
		return
	}
	rej := REJ{
		TransactionID:    c.tid,
		LocalCommID:      c.localCommID,
		RemoteCommID:     c.remoteCommID,
		MessageRejected:  rejected,
		RejectInfoLength: 8,
		Reason:           RejectTimeout,
	}
	binary.BigEndian.PutUint64(rej.ARI[:], m.caGUID)
	if err := m.sendMsg(&rej, c.remoteGID, c.pkey); err != nil {
		m.log.Debug("cm: send REJ TIMEOUT", "conn", c, "err", err)
	}
}

// handleREJ ends a connection the peer refused. m.mu must be held.
func (m *Manager) handleREJ(r *REJ, src hca.GID) {
	m.stats.rejReceived[r.Reason]++
	var c *Conn
	if r.RemoteCommID != 0 {
		c = m.conns[r.RemoteCommID]
	} else {
		// A REJ sent before the peer learnt our comm ID (it timed out
		// waiting for our REP, or rejected our REQ without a connection):
		// passive connections are found by the peer's comm ID, active ones
		// cannot be and are covered by their own REQ timeout.
		c = m.byRemote[remoteKey{r.LocalCommID, src}]
	}
	if c == nil || c.remoteGID != src {
		m.stats.dropped[DropUnknownConn]++
		return
	}
	switch c.state {
	case StateREQSent, StateREQReceived, StateREPSent, StateEstablished:
		m.forget(c)
		m.queue(Event{Type: EventRejected, Conn: c, RejectReason: r.Reason,
			PrivateData: copyBytes(r.PrivateData[:])}, nil)
	default:
		m.stats.dropped[DropUnexpected]++
	}
}

// handleMRA extends the response timeout of the message it acknowledges
// by the service timeout it asks for. m.mu must be held.
func (m *Manager) handleMRA(r *MRA) {
	c := m.conns[r.RemoteCommID]
	if c == nil {
		m.stats.dropped[DropUnknownConn]++
		return
	}
	switch {
	case c.state == StateREQSent && r.MessageMRAed == RespondsToREQ,
		c.state == StateREPSent && r.MessageMRAed == RespondsToREP:
		if c.state == StateREQSent {
			c.remoteCommID = r.LocalCommID
		}
		// cm_mra_handler: the service time asked for plus the path's.
		m.setDeadline(c, convertToMS(peerTimeout(r.ServiceTimeout))+convertToMS(c.avTimeout))
	default:
		m.stats.dropped[DropUnexpected]++
	}
}
