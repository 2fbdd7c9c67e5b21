package hca

import (
	"errors"
	"fmt"
)

// QPState is a QP's state (IBTA 10.3.1). SQD and SQE are not modelled:
// IPoIB never uses them.
//
//go:generate go tool stringer -type=QPState -linecomment
type QPState int

// QP states.
const (
	QPStateReset QPState = iota // RESET
	QPStateInit                 // INIT
	QPStateRTR                  // RTR
	QPStateRTS                  // RTS
	QPStateError                // ERROR
)

// ErrIllegalTransition is wrapped by Modify when the requested state
// change is not allowed from the current state.
var ErrIllegalTransition = errors.New("illegal QP state transition")

// CheckTransition reports whether a QP of type t may move from -> to
// (IBTA 10.3.1 figure 124, without SQD/SQE). Any state may go to Reset or
// Error; otherwise Reset->Init, Init->Init, Init->RTR, RTR->RTS, RTS->RTS.
// Backends call it so every backend agrees on the table.
func CheckTransition(t QPType, from, to QPState) error {
	ok := false
	switch to {
	case QPStateReset, QPStateError:
		ok = from >= QPStateReset && from <= QPStateError
	case QPStateInit:
		ok = from == QPStateReset || from == QPStateInit
	case QPStateRTR:
		ok = from == QPStateInit
	case QPStateRTS:
		ok = from == QPStateRTR || from == QPStateRTS
	}
	if !ok {
		return fmt.Errorf("%s QP %s -> %s: %w", t, from, to, ErrIllegalTransition)
	}
	return nil
}
