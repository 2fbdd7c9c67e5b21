package wire

import (
	"errors"
	"fmt"
)

// DropReason says why a received packet was discarded. Receivers keep one
// counter per reason.
type DropReason uint8

// Drop reasons. The first group is found by the decoders of this package,
// the second by a receiver that looks the packet up against its QPs.
const (
	DropNone DropReason = iota
	// DropGarbage: shorter than a BTH plus ICRC, or not RoCEv2 at all.
	DropGarbage
	// DropTruncated: shorter than its opcode's headers, or longer than the
	// receive buffer (the datagram was cut).
	DropTruncated
	// DropBadTVer: transport header version not 0.
	DropBadTVer
	// DropBadOpcode: an opcode this implementation does not carry.
	DropBadOpcode
	// DropBadPadCount: pad bytes longer than the payload allows.
	DropBadPadCount
	// DropBadICRC: the invariant CRC does not match.
	DropBadICRC
	// DropBadPKey: P_Key not in the port's partition.
	DropBadPKey
	// DropBadQKey: UD Q_Key differs from the QP's.
	DropBadQKey
	// DropUnknownQP: no live QP with the destination QPN.
	DropUnknownQP
	// DropWrongState: the QP's type or state does not accept the packet.
	DropWrongState
	// DropNoBuffer: a UD packet found no posted receive buffer.
	DropNoBuffer
	// DropBadLength: a UD message longer than the path MTU.
	DropBadLength
	// DropFault: dropped on purpose by fault injection.
	DropFault
	// DropNotAllowed: the source address is outside the receiver's allow
	// list; found before the datagram is parsed.
	DropNotAllowed

	// NumDropReasons sizes per-reason counter arrays.
	NumDropReasons
)

var dropNames = [...]string{
	DropNone:        "none",
	DropGarbage:     "garbage",
	DropTruncated:   "truncated",
	DropBadTVer:     "bad_tver",
	DropBadOpcode:   "bad_opcode",
	DropBadPadCount: "bad_padcnt",
	DropBadICRC:     "bad_icrc",
	DropBadPKey:     "bad_pkey",
	DropBadQKey:     "bad_qkey",
	DropUnknownQP:   "unknown_qp",
	DropWrongState:  "wrong_state",
	DropNoBuffer:    "no_buffer",
	DropBadLength:   "bad_length",
	DropFault:       "fault",
	DropNotAllowed:  "not_allowed",
}

func (r DropReason) String() string {
	if int(r) < len(dropNames) {
		return dropNames[r]
	}
	return fmt.Sprintf("DropReason(%d)", uint8(r))
}

// Error makes a DropReason an error, so decoders return it directly and
// allocate nothing.
func (r DropReason) Error() string { return "rocev2: drop: " + r.String() }

// ErrMalformed is matched by every DropReason error via errors.Is.
var ErrMalformed = errors.New("rocev2: malformed packet")

// Is lets errors.Is(err, ErrMalformed) match any drop reason.
func (r DropReason) Is(target error) bool { return target == ErrMalformed }

// ReasonOf extracts the DropReason from an error returned by this package,
// DropGarbage for any other non-nil error and DropNone for nil.
func ReasonOf(err error) DropReason {
	if err == nil {
		return DropNone
	}
	var r DropReason
	if errors.As(err, &r) {
		return r
	}
	return DropGarbage
}
