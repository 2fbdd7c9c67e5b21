package netstack

// linkState is the endpoint's life cycle. Transitions: linkUp <-> linkDown
// (SetLinkUp), either -> linkClosed (Close, final).
//
//go:generate go tool stringer -type=linkState -linecomment
type linkState int32

const (
	// linkUp passes frames both ways.
	linkUp linkState = iota // up
	// linkDown has no carrier: frames both ways are dropped and counted,
	// as a NIC without carrier would; queued frames stay queued.
	linkDown // down
	// linkClosed is final: ReadFrames returns net.ErrClosed.
	linkClosed // closed
)
