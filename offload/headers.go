package offload

import (
	"errors"

	"github.com/ipoibcm/ipoib/internal/packet"
)

// IP protocol numbers this package segments and checksums.
const (
	ProtoTCP = packet.ProtoTCP
	ProtoUDP = packet.ProtoUDP
)

// Errors of the parsers and helpers; test with errors.Is.
var (
	// ErrTruncated: the frame ends inside a header it claims to have.
	ErrTruncated = packet.ErrTruncated
	// ErrNotIP: the network header is neither IPv4 nor IPv6.
	ErrNotIP = packet.ErrNotIP
	// ErrNotL4: the IP payload is not TCP or UDP (or sits behind IPv6
	// extension headers or an IPv4 fragment, which no offload covers).
	ErrNotL4 = packet.ErrNotTransport
	// ErrBadLength: the IP length fields disagree with the frame.
	ErrBadLength = packet.ErrBadLength
	// ErrTooManySegments: the caller gave fewer output buffers than the
	// segmentation needs.
	ErrTooManySegments = errors.New("more segments than output buffers")
	// ErrSegmentBuffer: an output buffer cannot hold one segment.
	ErrSegmentBuffer = errors.New("output buffer smaller than a segment")
	// ErrBadMSS: the segment size is zero or negative.
	ErrBadMSS = errors.New("segment size not positive")
)

// Headers is where the headers of one IP packet lie inside a frame: the
// packet layer's reading, with the offloads' methods on it.
type Headers packet.Headers

// CsumOffset is the offset of the L4 checksum field inside its header.
func (h Headers) CsumOffset() int {
	if h.Proto == ProtoTCP {
		return 16
	}
	return 6
}

// Parse finds the IPv4/IPv6 and TCP/UDP headers of the packet that starts
// at l3off in frame (packet.ParseHeaders). It rejects IPv4 fragments,
// IPv6 extension headers and length fields that point past the frame.
func Parse(frame []byte, l3off int) (Headers, error) {
	h, err := packet.ParseHeaders(frame, l3off)
	return Headers(h), err
}

// ReadHeaders is Parse without the error value (packet.ReadHeaders): ip
// reports a whole IP header whose lengths hold together, l4 that Parse
// would return no error. A receive path that checks the IP header, fills
// a checksum verdict and coalesces reads a packet once with it and hands
// the reading on (gro.Coalescer.AddHeaders).
func ReadHeaders(frame []byte, l3off int) (h Headers, ip, l4 bool) {
	ph, ip, l4 := packet.ReadHeaders(frame, l3off)
	return Headers(ph), ip, l4
}
