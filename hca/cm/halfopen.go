package cm

import "github.com/ipoibcm/ipoib/hca"

// A passive connection is half-open from its REQ until the peer proves
// it received our REP (RTU, or a first packet on the QP through
// NotifyEstablished): until then the REQ's source address is unverified
// and may be spoofed. Two rules keep such sources from costing us memory
// or turning the CM into a reflector:
//
//   - The half-open set is bounded per Manager (Options.MaxHalfOpen) and
//     per remote GID (Options.MaxHalfOpenPerGID). A REQ from a GID at its
//     own limit is rejected (NO_RESOURCES); a REQ that finds the Manager
//     full evicts the oldest handshake of the GID holding the most, so a
//     flood from a few sources cannot starve a peer with one pending
//     handshake.
//   - Every MAD sent to an unverified source is paid from a budget of
//     unverifiedMADsPerREQ per REQ received for that connection
//     (duplicates included). REQ and every answer are one 256-byte MAD,
//     so we never send a source that never answered more than twice the
//     bytes it sent us. When the budget is spent the handshake ends
//     silently: no further REP resend, no REJ TIMEOUT.

// unverifiedMADsPerREQ is the answer budget one REQ buys: the REP and one
// resend after a response timeout.
const unverifiedMADsPerREQ = 2

// halfOpenSet is one remote GID's pending handshakes, oldest first.
type halfOpenSet struct {
	conns []*Conn
}

// enterHalfOpen records a new passive connection as half-open with the
// budget of its REQ. m.mu must be held.
func (m *Manager) enterHalfOpen(c *Conn) {
	s := m.halfOpen[c.remoteGID]
	if s == nil {
		s = &halfOpenSet{}
		m.halfOpen[c.remoteGID] = s
	}
	m.halfOpenSeq++
	c.halfOpenSeq = m.halfOpenSeq
	c.halfOpen = true
	c.credit = unverifiedMADsPerREQ
	s.conns = append(s.conns, c)
	m.halfOpenCount++
}

// leaveHalfOpen drops c from the half-open set: it was verified or is
// gone. Idempotent. m.mu must be held.
func (m *Manager) leaveHalfOpen(c *Conn) {
	if !c.halfOpen {
		return
	}
	c.halfOpen = false
	s := m.halfOpen[c.remoteGID]
	if s == nil {
		return
	}
	for k, x := range s.conns {
		if x == c {
			s.conns = append(s.conns[:k], s.conns[k+1:]...)
			m.halfOpenCount--
			break
		}
	}
	if len(s.conns) == 0 {
		delete(m.halfOpen, c.remoteGID)
	}
}

// admitHalfOpen decides whether a new REQ from src may start a
// handshake, evicting one if the Manager is full. It reports false when
// src is at its own limit. m.mu must be held.
func (m *Manager) admitHalfOpen(src hca.GID) bool {
	if s := m.halfOpen[src]; s != nil && len(s.conns) >= m.opts.MaxHalfOpenPerGID {
		return false
	}
	if m.halfOpenCount < m.opts.MaxHalfOpen {
		return true
	}
	var victim *halfOpenSet
	for _, s := range m.halfOpen {
		if victim == nil || len(s.conns) > len(victim.conns) ||
			len(s.conns) == len(victim.conns) && s.conns[0].halfOpenSeq < victim.conns[0].halfOpenSeq {
			victim = s
		}
	}
	c := victim.conns[0]
	m.stats.halfOpenEvicted++
	m.forget(c)
	m.queue(Event{Type: EventTimedOut, Conn: c}, nil)
	return true
}

// mayAnswer spends one MAD of c's budget if c is an unverified passive
// connection, and reports whether the MAD may go. m.mu must be held.
func (m *Manager) mayAnswer(c *Conn) bool {
	if !c.halfOpen {
		return true
	}
	if c.credit <= 0 {
		m.stats.unverifiedSuppressed++
		return false
	}
	c.credit--
	return true
}
