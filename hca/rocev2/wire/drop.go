package wire

import (
	"errors"
)

// DropReason says why a received packet was discarded. Receivers keep one
// counter per reason.
//
//go:generate go tool stringer -type=DropReason -linecomment
type DropReason uint8

// Drop reasons. The first group is found by the decoders of this package,
// the second by a receiver that looks the packet up against its QPs.
const (
	DropNone DropReason = iota // none
	// DropGarbage: shorter than a BTH plus ICRC, or not RoCEv2 at all.
	DropGarbage // garbage
	// DropTruncated: shorter than its opcode's headers, or longer than the
	// receive buffer (the datagram was cut).
	DropTruncated // truncated
	// DropBadTVer: transport header version not 0.
	DropBadTVer // bad_tver
	// DropBadOpcode: an opcode this implementation does not carry.
	DropBadOpcode // bad_opcode
	// DropBadPadCount: pad bytes longer than the payload allows.
	DropBadPadCount // bad_padcnt
	// DropBadICRC: the invariant CRC does not match.
	DropBadICRC // bad_icrc
	// DropBadPKey: P_Key not in the port's partition.
	DropBadPKey // bad_pkey
	// DropBadQKey: UD Q_Key differs from the QP's.
	DropBadQKey // bad_qkey
	// DropUnknownQP: no live QP with the destination QPN.
	DropUnknownQP // unknown_qp
	// DropWrongState: the QP's type or state does not accept the packet.
	DropWrongState // wrong_state
	// DropNoBuffer: a UD packet found no posted receive buffer.
	DropNoBuffer // no_buffer
	// DropBadLength: a UD message longer than the path MTU.
	DropBadLength // bad_length
	// DropFault: dropped on purpose by fault injection.
	DropFault // fault
	// DropNotAllowed: the source address is outside the receiver's allow
	// list; found before the datagram is parsed.
	DropNotAllowed // not_allowed
	// DropBadMcast: a datagram to a multicast group that is not a UD
	// send to QP 0xFFFFFF.
	DropBadMcast // bad_mcast
	// DropNotAttached: a multicast UD packet no local QP attached to
	// its group took (none attached with its Q_Key and P_Key).
	DropNotAttached // not_attached

	// NumDropReasons sizes per-reason counter arrays.
	NumDropReasons
)

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
