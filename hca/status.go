package hca

// Status is the completion status of a work request (IBTA 10.7.2.6, Linux
// enum ib_wc_status, the subset a send/receive transport produces).
//
//go:generate go tool stringer -type=Status -linecomment
type Status int

// Completion statuses.
const (
	StatusSuccess Status = iota // success
	// StatusLocLenErr: the message did not fit the receive buffer (receiver)
	// or exceeded the QP's limits (sender).
	StatusLocLenErr // local length error
	// StatusWRFlushErr: the QP was in the Error state.
	StatusWRFlushErr // WR flushed
	// StatusRNRRetryExcErr: the responder had no receive buffer and the RNR
	// retry count ran out.
	StatusRNRRetryExcErr // RNR retry counter exceeded
	// StatusRetryExcErr: no ACK within the transport timeout, retries exhausted.
	StatusRetryExcErr // transport retry counter exceeded
	// StatusRemInvReqErr: the responder rejected the request (e.g. the
	// message was longer than its receive buffer).
	StatusRemInvReqErr // remote invalid request error
	// StatusRemOpErr: the responder failed to complete the operation.
	StatusRemOpErr // remote operation error
)

// WCOpcode says which kind of work a completion is for.
//
//go:generate go tool stringer -type=WCOpcode -linecomment
type WCOpcode int

// Completion opcodes.
const (
	WCSend WCOpcode = iota + 1 // send
	WCRecv                     // recv
)
