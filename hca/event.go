package hca

import "fmt"

// EventType names an asynchronous event.
type EventType int

// Asynchronous events (Linux enum ib_event_type, the subset IPoIB uses).
const (
	EventQPLastWQEReached EventType = iota + 1
	EventQPFatal
	EventCQErr
	EventSRQLimitReached
	EventPortActive
	EventPortErr
)

var eventNames = [...]string{
	EventQPLastWQEReached: "QP_LAST_WQE_REACHED",
	EventQPFatal:          "QP_FATAL",
	EventCQErr:            "CQ_ERR",
	EventSRQLimitReached:  "SRQ_LIMIT_REACHED",
	EventPortActive:       "PORT_ACTIVE",
	EventPortErr:          "PORT_ERR",
}

func (e EventType) String() string {
	if e > 0 && int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", int(e))
}

// AsyncEvent is an asynchronous event. QP events carry the QP's QPN and
// Context.
type AsyncEvent struct {
	Type    EventType
	QPN     QPN
	Context any
}
