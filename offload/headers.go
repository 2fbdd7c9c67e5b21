package offload

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// IP protocol numbers this package segments and checksums.
const (
	ProtoTCP = 6
	ProtoUDP = 17
)

// Errors of the parsers and helpers; test with errors.Is.
var (
	// ErrTruncated: the frame ends inside a header it claims to have.
	ErrTruncated = errors.New("frame truncated inside its headers")
	// ErrNotIP: the network header is neither IPv4 nor IPv6.
	ErrNotIP = errors.New("not an IPv4 or IPv6 packet")
	// ErrNotL4: the IP payload is not TCP or UDP (or sits behind IPv6
	// extension headers or an IPv4 fragment, which no offload covers).
	ErrNotL4 = errors.New("not a TCP or UDP packet")
	// ErrBadLength: the IP length fields disagree with the frame.
	ErrBadLength = errors.New("IP length disagrees with the frame")
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
	ip := frame[l3off:]
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < 20 {
			return h, ErrTruncated
		}
		ihl := int(ip[0]&0xF) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if ihl < 20 || tot < ihl {
			return h, fmt.Errorf("ipv4 ihl %d total %d: %w", ihl, tot, ErrBadLength)
		}
		if tot > len(ip) {
			return h, fmt.Errorf("ipv4 total length %d past %d bytes: %w", tot, len(ip), ErrBadLength)
		}
		if binary.BigEndian.Uint16(ip[6:])&0x3FFF != 0 {
			return h, fmt.Errorf("ipv4 fragment: %w", ErrNotL4)
		}
		h.Proto, h.L4, h.Len = ip[9], l3off+ihl, l3off+tot
	case 6:
		if len(ip) < 40 {
			return h, ErrTruncated
		}
		pl := int(binary.BigEndian.Uint16(ip[4:]))
		if 40+pl > len(ip) {
			return h, fmt.Errorf("ipv6 payload length %d past %d bytes: %w", pl, len(ip)-40, ErrBadLength)
		}
		h.IPv6, h.Proto, h.L4, h.Len = true, ip[6], l3off+40, l3off+40+pl
	default:
		return h, ErrNotIP
	}
	switch h.Proto {
	case ProtoTCP:
		if h.Len < h.L4+20 {
			return h, ErrTruncated
		}
		off := int(frame[h.L4+12]>>4) * 4
		if off < 20 || h.L4+off > h.Len {
			return h, fmt.Errorf("tcp data offset %d: %w", off, ErrTruncated)
		}
		h.End = h.L4 + off
	case ProtoUDP:
		if h.Len < h.L4+8 {
			return h, ErrTruncated
		}
		h.End = h.L4 + 8
	default:
		return h, fmt.Errorf("ip protocol %d: %w", h.Proto, ErrNotL4)
	}
	return h, nil
}
