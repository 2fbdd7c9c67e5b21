package cm

import (
	"errors"
)

// DropReason says why a received MAD was dropped.
//
//go:generate go tool stringer -type=DropReason -linecomment
type DropReason int

// Drop reasons: the first group is malformed MADs (DecodeMAD errors), the
// second MADs that decode but match no connection in a fitting state.
const (
	DropShort        DropReason = iota // short
	DropLong                           // long
	DropBaseVersion                    // base_version
	DropMgmtClass                      // mgmt_class
	DropClassVersion                   // class_version
	DropMethod                         // method
	DropAttribute                      // attribute
	DropInconsistent                   // inconsistent_field
	DropRecvError                      // recv_error
	DropUnknownConn                    // unknown_comm_id
	DropUnexpected                     // unexpected_in_state
	DropBacklog                        // backlog
	dropReasonCount
)

// dropReasonOf maps a decoding error to its drop reason.
func dropReasonOf(err error) DropReason {
	switch {
	case errors.Is(err, ErrShortMAD):
		return DropShort
	case errors.Is(err, ErrLongMAD):
		return DropLong
	case errors.Is(err, ErrBaseVersion):
		return DropBaseVersion
	case errors.Is(err, ErrMgmtClass):
		return DropMgmtClass
	case errors.Is(err, ErrClassVersion):
		return DropClassVersion
	case errors.Is(err, ErrMethod):
		return DropMethod
	case errors.Is(err, ErrAttribute):
		return DropAttribute
	}
	return DropInconsistent
}

// REQOutcome says what became of a received, well-formed REQ: every REQ
// is counted under exactly one.
//
//go:generate go tool stringer -type=REQOutcome -linecomment
type REQOutcome int

// REQ outcomes.
const (
	// REQToListener: a new handshake, handed to the listener, whose
	// decision (REP or REJ) is the consumer's to count.
	REQToListener REQOutcome = iota // to_listener
	// REQDuplicate: a resent REQ of a handshake already known.
	REQDuplicate // duplicate
	// REQStale: rejected STALE_CONN; the old connection was told.
	REQStale // stale
	// REQNoListener: rejected INVALID_SERVICE_ID.
	REQNoListener // no_listener
	// REQBadTransport: rejected INVALID_TRANSPORT_TYPE (not RC).
	REQBadTransport // bad_transport
	// REQHalfOpenPerGID: rejected NO_RESOURCES, the source already has
	// Options.MaxHalfOpenPerGID handshakes pending.
	REQHalfOpenPerGID // half_open_per_gid_limit
	// REQUnexpected: a new transaction for a comm ID in a state that
	// cannot take it; dropped.
	REQUnexpected // unexpected
	// REQBadPKey: rejected INVALID_GID, the REQ's partition has no entry
	// in the port's table that its P_Key matches (IBTA 10.9.3).
	REQBadPKey // bad_pkey
	// REQWrongPartition: rejected INVALID_SERVICE_ID, the service's
	// listener serves another partition.
	REQWrongPartition // wrong_partition
	numREQOutcomes
)

// MarshalText names the outcome in JSON map keys.
func (o REQOutcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Stats is a snapshot of a Manager's counters.
type Stats struct {
	Sent     map[MsgType]uint64 `json:"sent"`     // MADs posted, per type (retries included)
	Received map[MsgType]uint64 `json:"received"` // well-formed MADs received, per type
	// Retries counts resends after a response timeout.
	Retries uint64 `json:"retries"`
	// Timeouts counts REQ/REP/DREQ transactions whose retries ran out.
	Timeouts uint64 `json:"timeouts"`
	// Dropped counts received MADs dropped, per reason.
	Dropped map[DropReason]uint64 `json:"dropped"`
	// StaleREQs counts REQs rejected with STALE_CONN.
	StaleREQs uint64 `json:"stale_reqs"`
	// DuplicateREQs counts REQs for a connection already known.
	DuplicateREQs uint64 `json:"duplicate_reqs"`
	// UnknownDREQs counts DREQs for no connection, answered with DREP.
	UnknownDREQs uint64                  `json:"unknown_dreqs"`
	RejSent      map[RejectReason]uint64 `json:"rej_sent"`
	RejReceived  map[RejectReason]uint64 `json:"rej_received"`
	// SendErrors counts MADs that could not be posted (no free send slot,
	// PostSend error) or completed in error; the retry timer covers them.
	SendErrors uint64 `json:"send_errors"`
	// REQs counts every well-formed REQ received by what became of it;
	// the values sum to Received[REQ].
	REQs map[REQOutcome]uint64 `json:"req_outcomes"`
	// HalfOpen is the number of passive connections not yet verified
	// (REQ answered, no RTU or packet yet); MaxHalfOpen and
	// MaxHalfOpenPerGID are its limits.
	HalfOpen          int `json:"half_open"`
	MaxHalfOpen       int `json:"max_half_open"`
	MaxHalfOpenPerGID int `json:"max_half_open_per_gid"`
	// HalfOpenEvicted counts handshakes dropped, silently, to make room
	// for a REQ that found the half-open set full.
	HalfOpenEvicted uint64 `json:"half_open_evicted"`
	// UnverifiedGiveUps counts handshakes ended silently when their
	// unverified source's answer budget (two MADs per REQ) was spent.
	UnverifiedGiveUps uint64 `json:"unverified_give_ups"`
	// UnverifiedSuppressed counts MADs not sent to an unverified source
	// because its budget was spent.
	UnverifiedSuppressed uint64 `json:"unverified_suppressed"`
	// LiveConns is the number of connections the Manager tracks, time-wait
	// included.
	LiveConns int `json:"live_conns"`
	// Listeners is the number of service IDs listened on.
	Listeners int `json:"listeners"`
}

// counters are the live counters behind Stats, guarded by Manager.mu.
type counters struct {
	sent, received [len(msgTypes)]uint64
	retries        uint64
	timeouts       uint64
	dropped        [dropReasonCount]uint64
	staleREQs      uint64
	dupREQs        uint64
	unknownDREQs   uint64
	rejSent        map[RejectReason]uint64
	rejReceived    map[RejectReason]uint64
	sendErrors     uint64
	reqs           [numREQOutcomes]uint64

	halfOpenEvicted, unverifiedGiveUps, unverifiedSuppressed uint64
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Sent:          make(map[MsgType]uint64),
		Received:      make(map[MsgType]uint64),
		Retries:       c.retries,
		Timeouts:      c.timeouts,
		Dropped:       make(map[DropReason]uint64),
		StaleREQs:     c.staleREQs,
		DuplicateREQs: c.dupREQs,
		UnknownDREQs:  c.unknownDREQs,
		RejSent:       make(map[RejectReason]uint64, len(c.rejSent)),
		RejReceived:   make(map[RejectReason]uint64, len(c.rejReceived)),
		SendErrors:    c.sendErrors,
		REQs:          make(map[REQOutcome]uint64),

		HalfOpenEvicted:      c.halfOpenEvicted,
		UnverifiedGiveUps:    c.unverifiedGiveUps,
		UnverifiedSuppressed: c.unverifiedSuppressed,
	}
	// Every message type, REQ outcome, drop and reject reason is present,
	// zero included, so the JSON has one schema whatever has happened.
	for o, n := range c.reqs {
		s.REQs[REQOutcome(o)] = n
	}
	for i, t := range msgTypes {
		s.Sent[t] = c.sent[i]
		s.Received[t] = c.received[i]
	}
	for r, n := range c.dropped {
		s.Dropped[DropReason(r)] = n
	}
	for _, r := range rejectReasons {
		s.RejSent[r], s.RejReceived[r] = 0, 0
	}
	for r, n := range c.rejSent {
		s.RejSent[r] = n
	}
	for r, n := range c.rejReceived {
		s.RejReceived[r] = n
	}
	return s
}

// MarshalText makes the Stats maps readable in JSON ("REQ": 3, not "16": 3).
func (t MsgType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText names the reason in JSON map keys.
func (r RejectReason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// MarshalText names the reason in JSON map keys.
func (r DropReason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }
