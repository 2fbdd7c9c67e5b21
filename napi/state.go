package napi

import "fmt"

// State is the lifecycle state of a Context.
type State int32

// Context lifecycle states. Transitions only go forward:
// StateNew -> StateRunning -> StateStopped, or StateNew -> StateStopped.
const (
	// StateNew: created, no goroutine yet; Schedule is remembered.
	StateNew State = iota
	// StateRunning: the poll goroutine runs and the CQ has been armed.
	StateRunning
	// StateStopped: the goroutine has been told to exit (or never
	// started); Handle is not called once Stop has returned.
	StateStopped
)

func (s State) String() string {
	switch s {
	case StateNew:
		return "new"
	case StateRunning:
		return "running"
	case StateStopped:
		return "stopped"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}
