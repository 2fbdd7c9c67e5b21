package hca

import "fmt"

// Status is the completion status of a work request (IBTA 10.7.2.6, Linux
// enum ib_wc_status, the subset a send/receive transport produces).
type Status int

// Completion statuses.
const (
	StatusSuccess Status = iota
	// StatusLocLenErr: the message did not fit the receive buffer (receiver)
	// or exceeded the QP's limits (sender).
	StatusLocLenErr
	// StatusWRFlushErr: the QP was in the Error state.
	StatusWRFlushErr
	// StatusRNRRetryExcErr: the responder had no receive buffer and the RNR
	// retry count ran out.
	StatusRNRRetryExcErr
	// StatusRetryExcErr: no ACK within the transport timeout, retries exhausted.
	StatusRetryExcErr
	// StatusRemInvReqErr: the responder rejected the request (e.g. the
	// message was longer than its receive buffer).
	StatusRemInvReqErr
	// StatusRemOpErr: the responder failed to complete the operation.
	StatusRemOpErr
)

var statusNames = [...]string{
	StatusSuccess:        "success",
	StatusLocLenErr:      "local length error",
	StatusWRFlushErr:     "WR flushed",
	StatusRNRRetryExcErr: "RNR retry counter exceeded",
	StatusRetryExcErr:    "transport retry counter exceeded",
	StatusRemInvReqErr:   "remote invalid request error",
	StatusRemOpErr:       "remote operation error",
}

func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// WCOpcode says which kind of work a completion is for.
type WCOpcode int

// Completion opcodes.
const (
	WCSend WCOpcode = iota + 1
	WCRecv
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "send"
	case WCRecv:
		return "recv"
	}
	return fmt.Sprintf("WCOpcode(%d)", int(o))
}
