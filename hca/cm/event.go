package cm

// EventType names what happened to a connection.
//
//go:generate go tool stringer -type=EventType -linecomment
type EventType int

// Connection events.
const (
	// EventEstablished: RTU sent (active) or RTU / first receive seen
	// (passive).
	EventEstablished EventType = iota + 1 // ESTABLISHED
	// EventREPReceived: active side, the QP is in RTS; the RTU leaves when
	// the handler returns, unless it called Conn.Reject.
	EventREPReceived // REP_RECEIVED
	// EventRejected: the peer sent REJ (RejectReason), or the CM rejected a
	// REP it could not apply (Err set).
	EventRejected // REJECTED
	// EventTimedOut: REQ or REP retries ran out; a REJ TIMEOUT was sent.
	EventTimedOut // TIMED_OUT
	// EventDisconnectRequested: the peer sent DREQ; the CM already answered
	// with DREP and the connection is in time-wait.
	EventDisconnectRequested // DISCONNECT_REQUESTED
	// EventDisconnected: our DREQ was answered by DREP (or crossed the
	// peer's DREQ), or its retries ran out; the connection is in time-wait.
	EventDisconnected // DISCONNECTED
	// EventTimeWaitExit: time-wait ended; the connection is idle and
	// forgotten.
	EventTimeWaitExit // TIMEWAIT_EXIT
	// EventStale: a new REQ from the same remote QPN and GID showed this
	// established connection to be stale (the peer restarted); tear it down.
	EventStale // STALE
)

// Event is delivered to a connection's Handler.
type Event struct {
	Type EventType
	Conn *Conn
	// PrivateData is a copy of the private data of the REP
	// (EventREPReceived), REJ (EventRejected) or DREQ
	// (EventDisconnectRequested) that caused the event.
	PrivateData []byte
	// RejectReason is set for EventRejected.
	RejectReason RejectReason
	// Err is set when the event comes from a local failure (a QP that
	// could not be moved to RTR/RTS).
	Err error
}

// Handler receives a connection's events on the Manager's goroutine. It
// must not block; it may call the Conn's methods.
type Handler func(Event)
