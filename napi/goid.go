package napi

import (
	"errors"
	"runtime"
)

// errNoGoroutineID is returned when a stack header does not start with
// "goroutine <id> ".
var errNoGoroutineID = errors.New("no goroutine id in stack header")

// goroutineID returns the runtime's id of the calling goroutine, or 0 if it
// cannot be read.
//
// Go hides goroutine identity on purpose; napi needs it only so that Sync and
// Stop can tell that they were called from Handle, on the poll goroutine,
// where waiting for the poll lock or for the goroutine would deadlock. Both
// are control-path calls, so the cost of formatting a stack header (about a
// microsecond) does not matter.
func goroutineID() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	id, err := parseGoroutineID(buf[:n])
	if err != nil {
		return 0
	}
	return id
}

// parseGoroutineID extracts N from a stack header "goroutine N [status]:".
func parseGoroutineID(b []byte) (uint64, error) {
	const prefix = "goroutine "
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return 0, errNoGoroutineID
	}
	b = b[len(prefix):]
	var id uint64
	digits := 0
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			break
		}
		d := uint64(ch - '0')
		if id > (^uint64(0)-d)/10 {
			return 0, errNoGoroutineID
		}
		id = id*10 + d
		digits++
	}
	if digits == 0 || digits == len(b) || b[digits] != ' ' || id == 0 {
		return 0, errNoGoroutineID
	}
	return id, nil
}
