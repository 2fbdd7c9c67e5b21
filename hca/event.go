package hca

// EventType names an asynchronous event.
//
//go:generate go tool stringer -type=EventType -linecomment
type EventType int

// Asynchronous events (Linux enum ib_event_type, the subset IPoIB uses).
const (
	EventQPLastWQEReached EventType = iota + 1 // QP_LAST_WQE_REACHED
	EventQPFatal                               // QP_FATAL
	EventCQErr                                 // CQ_ERR
	EventSRQLimitReached                       // SRQ_LIMIT_REACHED
	EventPortActive                            // PORT_ACTIVE
	EventPortErr                               // PORT_ERR
	// EventPortPKeyChange: the port's P_Key table changed (the subnet
	// manager, or its stand-in, rewrote it).
	EventPortPKeyChange // PKEY_CHANGE
)

// AsyncEvent is an asynchronous event. QP events carry the QP's QPN and
// Context.
type AsyncEvent struct {
	Type    EventType
	QPN     QPN
	Context any
}
