package offload

import (
	"errors"
	"fmt"

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
	ErrNotL4 = errors.New("not a TCP or UDP packet")
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

// Headers is where the headers of one IP packet lie inside a frame.
type Headers struct {
	// L3 is the offset of the IP header; IPv6 tells which one.
	L3   int
	IPv6 bool
	// Proto is ProtoTCP or ProtoUDP.
	Proto uint8
	// L4 is the offset of the TCP/UDP header, End the offset just past it
	// (so End is the length of everything a segment repeats).
	L4, End int
	// Len is the packet's length per its IP header, link header included:
	// bytes past it are link padding.
	Len int
}

// CsumOffset is the offset of the L4 checksum field inside its header.
func (h Headers) CsumOffset() int {
	if h.Proto == ProtoTCP {
		return 16
	}
	return 6
}

// Parse finds the IPv4/IPv6 and TCP/UDP headers of the packet that starts
// at l3off in frame. It rejects IPv4 fragments, IPv6 extension headers
// and length fields that point past the frame.
func Parse(frame []byte, l3off int) (Headers, error) {
	h := Headers{L3: l3off}
	if l3off < 0 || len(frame) < l3off+1 {
		return h, ErrTruncated
	}
	ip, err := packet.ParseIP(frame[l3off:])
	if err != nil {
		return h, err
	}
	if ip.Fragment {
		return h, fmt.Errorf("ipv4 fragment: %w", ErrNotL4)
	}
	h.IPv6, h.Proto, h.L4, h.Len = ip.IPv6, ip.Protocol, l3off+ip.HeaderLen, l3off+ip.Len
	n, err := packet.TransportLen(h.Proto, frame[h.L4:h.Len])
	if err != nil {
		if errors.Is(err, packet.ErrNotTransport) {
			return h, fmt.Errorf("ip protocol %d: %w", h.Proto, ErrNotL4)
		}
		return h, err
	}
	h.End = h.L4 + n
	return h, nil
}
