package cm

import "fmt"

// EventType names what happened to a connection.
type EventType int

// Connection events.
const (
	// EventEstablished: RTU sent (active) or RTU / first receive seen
	// (passive).
	EventEstablished EventType = iota + 1
	// EventREPReceived: active side, the QP is in RTS; the RTU leaves when
	// the handler returns, unless it called Conn.Reject.
	EventREPReceived
	// EventRejected: the peer sent REJ (RejectReason), or the CM rejected a
	// REP it could not apply (Err set).
	EventRejected
	// EventTimedOut: REQ or REP retries ran out; a REJ TIMEOUT was sent.
	EventTimedOut
	// EventDisconnectRequested: the peer sent DREQ; the CM already answered
	// with DREP and the connection is in time-wait.
	EventDisconnectRequested
	// EventDisconnected: our DREQ was answered by DREP (or crossed the
	// peer's DREQ), or its retries ran out; the connection is in time-wait.
	EventDisconnected
	// EventTimeWaitExit: time-wait ended; the connection is idle and
	// forgotten.
	EventTimeWaitExit
	// EventStale: a new REQ from the same remote QPN and GID showed this
	// established connection to be stale (the peer restarted); tear it down.
	EventStale
)

var eventNames = [...]string{
	EventEstablished:         "ESTABLISHED",
	EventREPReceived:         "REP_RECEIVED",
	EventRejected:            "REJECTED",
	EventTimedOut:            "TIMED_OUT",
	EventDisconnectRequested: "DISCONNECT_REQUESTED",
	EventDisconnected:        "DISCONNECTED",
	EventTimeWaitExit:        "TIMEWAIT_EXIT",
	EventStale:               "STALE",
}

func (e EventType) String() string {
	if e > 0 && int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", int(e))
}

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
