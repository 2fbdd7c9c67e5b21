package ipoibcm

import (
	"fmt"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// EventKind names one step in the life of a connection.
type EventKind uint8

// Connection lifecycle events, in the order a connection meets them.
const (
	// EventTXConnect: the REQ of an active connection was sent.
	EventTXConnect EventKind = iota + 1
	// EventTXEstablished: the REP arrived and the RTU went out; Elapsed
	// is the time since the REQ (the CM connect time).
	EventTXEstablished
	// EventTXConnectFailed: REJ (Detail: the reason) or no answer.
	EventTXConnectFailed
	// EventTXTeardown: the active connection is torn down (DREQ).
	EventTXTeardown
	// EventTXDestroyed: its QP is destroyed.
	EventTXDestroyed
	// EventRXAccepted: a REQ was accepted and the REP sent.
	EventRXAccepted
	// EventRXRejected: a REQ was refused (Detail: the reason).
	EventRXRejected
	// EventDeadSet: the dead flag of a passive connection was set under
	// the RX poll lock (Detail: why the teardown began).
	EventDeadSet
	// EventQPError: the passive connection's QP was moved to Error.
	EventQPError
	// EventLastWQE: LAST_WQE_REACHED arrived for the passive QP.
	EventLastWQE
	// EventDrainPosted: the drain WR that covers this connection was
	// posted (Detail: on which QP).
	EventDrainPosted
	// EventDrainCompleted: that drain WR's completion was polled.
	EventDrainCompleted
	// EventReaped: the passive QP and its CM id were destroyed; Elapsed
	// is the time since the dead flag was set (the passive teardown time).
	EventReaped
	numEventKinds
)

var eventNames = [...]string{
	EventTXConnect: "tx_connect", EventTXEstablished: "tx_established", EventTXConnectFailed: "tx_connect_failed",
	EventTXTeardown: "tx_teardown", EventTXDestroyed: "tx_destroyed",
	EventRXAccepted: "rx_accepted", EventRXRejected: "rx_rejected",
	EventDeadSet: "dead_set", EventQPError: "qp_error", EventLastWQE: "last_wqe",
	EventDrainPosted: "drain_posted", EventDrainCompleted: "drain_completed", EventReaped: "reaped",
}

func (k EventKind) String() string {
	if k > 0 && k < numEventKinds {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", k)
}

// Event is one connection lifecycle step of an Interface.
type Event struct {
	Kind      EventKind
	At        time.Time
	QPN       hca.QPN // the local QP of the connection (0 before it exists)
	RemoteQPN hca.QPN // the peer's QP, when known
	Peer      hca.GID
	Elapsed   time.Duration // see EventTXEstablished and EventReaped
	Detail    string
}

// String is the event as one line, the form ipoib capture writes as a
// pcapng comment.
func (e Event) String() string {
	s := fmt.Sprintf("%s qpn 0x%06x", e.Kind, uint32(e.QPN))
	if e.RemoteQPN != 0 {
		s += fmt.Sprintf(" remote 0x%06x", uint32(e.RemoteQPN))
	}
	s += " peer " + e.Peer.String()
	if e.Elapsed > 0 {
		s += " after " + e.Elapsed.String()
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// EventObserver is told of every connection lifecycle event: ipoib
// capture writes them next to the packets, the metrics time connects and
// teardowns with them. ObserveEvent runs on the engine's goroutines
// (mostly the control loop, sometimes the CM's): it must return quickly,
// must not block and must not call back into the Interface.
type EventObserver interface {
	ObserveEvent(Event)
}

// observer is how the engine's owners tell Config.Events of a step; its
// zero value observes nothing.
type observer struct{ o EventObserver }

// on reports whether anyone listens, so callers skip gathering an
// event's fields when no one does.
func (ob observer) on() bool { return ob.o != nil }

// emit hands the event to the observer, if there is one.
func (ob observer) emit(kind EventKind, qpn, remote hca.QPN, peer hca.GID, elapsed time.Duration, detail string) {
	if ob.o == nil {
		return
	}
	ob.o.ObserveEvent(Event{Kind: kind, At: time.Now(), QPN: qpn, RemoteQPN: remote, Peer: peer, Elapsed: elapsed, Detail: detail})
}

// Observers combines observers into one; nil ones are skipped, and with
// none left the result is nil (no observation at all).
func Observers(obs ...EventObserver) EventObserver {
	var l multiObserver
	for _, o := range obs {
		if o != nil {
			l = append(l, o)
		}
	}
	switch len(l) {
	case 0:
		return nil
	case 1:
		return l[0]
	}
	return l
}

type multiObserver []EventObserver

func (m multiObserver) ObserveEvent(e Event) {
	for _, o := range m {
		o.ObserveEvent(e)
	}
}
