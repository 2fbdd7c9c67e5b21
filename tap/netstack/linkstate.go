package netstack

import "fmt"

// linkState is the endpoint's life cycle. Transitions: linkUp <-> linkDown
// (SetLinkUp), either -> linkClosed (Close, final).
type linkState int32

const (
	// linkUp passes frames both ways.
	linkUp linkState = iota
	// linkDown has no carrier: frames both ways are dropped and counted,
	// as a NIC without carrier would; queued frames stay queued.
	linkDown
	// linkClosed is final: ReadFrames returns net.ErrClosed.
	linkClosed
)

func (s linkState) String() string {
	switch s {
	case linkUp:
		return "up"
	case linkDown:
		return "down"
	case linkClosed:
		return "closed"
	default:
		return fmt.Sprintf("linkState(%d)", int32(s))
	}
}
