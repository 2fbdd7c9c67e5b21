package cm

// State is a connection's CM state (IBTA 12.9.6 figures 137-139, the
// subset an RC consumer without LAP/APR goes through).
//
//go:generate go tool stringer -type=State -linecomment
type State int

// Connection states. A DREQ received is answered with a DREP at once, so a
// connection passes from Established straight to TimeWait on the passive
// end of a disconnect.
const (
	// StateIdle: not connected; a new, rejected, timed-out or finished
	// connection.
	StateIdle State = iota // IDLE
	// StateListening is the state of a Listener.
	StateListening // LISTEN
	// StateREQSent: active side, waiting for REP (or REJ, MRA).
	StateREQSent // REQ_SENT
	// StateREPReceived: active side, QP in RTS, the consumer's
	// EventREPReceived handler runs; RTU (or REJ) follows when it returns.
	StateREPReceived // REP_RCVD
	// StateREQReceived: passive side, the consumer has not decided yet
	// (Decision.Defer); duplicate REQs get an MRA.
	StateREQReceived // REQ_RCVD
	// StateREPSent: passive side, waiting for RTU or the first receive.
	StateREPSent // REP_SENT
	// StateEstablished: both sides may use the QP.
	StateEstablished // ESTABLISHED
	// StateDREQSent: waiting for DREP.
	StateDREQSent // DREQ_SENT
	// StateTimeWait: disconnected; late MADs for the connection are still
	// answered until the time-wait timer expires.
	StateTimeWait // TIMEWAIT
)
