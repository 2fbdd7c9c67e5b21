package napi

// State is the lifecycle state of a Context.
//
//go:generate go tool stringer -type=State -linecomment
type State int32

// Context lifecycle states. Transitions only go forward:
// StateNew -> StateRunning -> StateStopped, or StateNew -> StateStopped.
const (
	// StateNew: created, no goroutine yet; Schedule is remembered.
	StateNew State = iota // new
	// StateRunning: the poll goroutine runs and the CQ has been armed.
	StateRunning // running
	// StateStopped: the goroutine has been told to exit (or never
	// started); Handle is not called once Stop has returned.
	StateStopped // stopped
)
