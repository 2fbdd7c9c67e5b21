package cm

import "fmt"

// State is a connection's CM state (IBTA 12.9.6 figures 137-139, the
// subset an RC consumer without LAP/APR goes through).
type State int

// Connection states. A DREQ received is answered with a DREP at once, so a
// connection passes from Established straight to TimeWait on the passive
// end of a disconnect.
const (
	// StateIdle: not connected; a new, rejected, timed-out or finished
	// connection.
	StateIdle State = iota
	// StateListening is the state of a Listener.
	StateListening
	// StateREQSent: active side, waiting for REP (or REJ, MRA).
	StateREQSent
	// StateREPReceived: active side, QP in RTS, the consumer's
	// EventREPReceived handler runs; RTU (or REJ) follows when it returns.
	StateREPReceived
	// StateREQReceived: passive side, the consumer has not decided yet
	// (Decision.Defer); duplicate REQs get an MRA.
	StateREQReceived
	// StateREPSent: passive side, waiting for RTU or the first receive.
	StateREPSent
	// StateEstablished: both sides may use the QP.
	StateEstablished
	// StateDREQSent: waiting for DREP.
	StateDREQSent
	// StateTimeWait: disconnected; late MADs for the connection are still
	// answered until the time-wait timer expires.
	StateTimeWait
)

var stateNames = [...]string{
	StateIdle:        "IDLE",
	StateListening:   "LISTEN",
	StateREQSent:     "REQ_SENT",
	StateREPReceived: "REP_RCVD",
	StateREQReceived: "REQ_RCVD",
	StateREPSent:     "REP_SENT",
	StateEstablished: "ESTABLISHED",
	StateDREQSent:    "DREQ_SENT",
	StateTimeWait:    "TIMEWAIT",
}

func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}
