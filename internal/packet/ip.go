package packet

import (
	"errors"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// IP protocol numbers the datapath looks at, untyped so that they
// compare with a header byte and with gVisor's protocol numbers alike.
const (
	ProtoICMPv4 = 1
	ProtoIGMP   = 2
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// Errors of the parsers; test with errors.Is.
var (
	// ErrTruncated: the bytes end inside a header the packet has.
	ErrTruncated = errors.New("packet truncated inside its headers")
	// ErrNotIP: the version nibble is neither 4 nor 6.
	ErrNotIP = errors.New("not an IPv4 or IPv6 packet")
	// ErrBadLength: the IP length fields disagree with each other or
	// claim more bytes than there are.
	ErrBadLength = errors.New("IP length disagrees with the packet")
	// ErrNotTransport: the IP payload is neither TCP nor UDP, or not a
	// whole one (an IPv4 fragment).
	ErrNotTransport = errors.New("not a TCP or UDP packet")
)

// IP is what the fixed IPv4 or IPv6 header says about a packet.
type IP struct {
	// IPv6 tells the version; the packet is IPv4 when false.
	IPv6 bool
	// HeaderLen is the IPv4 header length, options included, or the
	// fixed 40 bytes of IPv6 (extension headers are not walked).
	HeaderLen int
	// Len is the packet's length per its header: bytes past it are link
	// padding.
	Len int
	// Protocol is the IPv4 protocol or the IPv6 next header.
	Protocol uint8
	// Fragment is set for any IPv4 fragment (more-fragments or a
	// non-zero offset), the first one included.
	Fragment bool
}

// ParseIP reads the IPv4 or IPv6 header at the front of b and checks that
// the packet it describes lies inside b. On ErrBadLength the fields are
// filled in as the header states them; on ErrTruncated and ErrNotIP only
// IPv6 may be.
//
// A well-formed packet is read without a further call (IPv4Lengths and
// IPv6Length inline).
func ParseIP(b []byte) (IP, error) {
	if hl, n, ok := IPv4Lengths(b); ok {
		ip := header.IPv4(b)
		return IP{HeaderLen: hl, Len: n, Protocol: ip.Protocol(), Fragment: fragmented(ip)}, nil
	}
	if n, ok := IPv6Length(b); ok {
		return IP{IPv6: true, HeaderLen: header.IPv6MinimumSize, Len: n, Protocol: header.IPv6(b).NextHeader()}, nil
	}
	return parseIPError(b)
}

// parseIPError is ParseIP for a packet that is not whole and well-formed:
// it says what is wrong.
func parseIPError(b []byte) (IP, error) {
	h, err := ParseIPHeader(b)
	if err == nil && h.Len > len(b) {
		err = ErrBadLength
	}
	return h, err
}

// ParseIPHeader is ParseIP for a packet that may be cut short (a quote
// inside an ICMP error, a capture's snap length): the header itself must
// be whole and consistent, while Len may point past the end of b.
func ParseIPHeader(b []byte) (IP, error) {
	switch header.IPVersion(b) {
	case -1:
		return IP{}, ErrTruncated
	case header.IPv4Version:
		if len(b) < header.IPv4MinimumSize {
			return IP{}, ErrTruncated
		}
		ip := header.IPv4(b)
		h := IP{
			HeaderLen: int(ip.HeaderLength()),
			Len:       int(ip.TotalLength()),
			Protocol:  ip.Protocol(),
			Fragment:  fragmented(ip),
		}
		if h.HeaderLen < header.IPv4MinimumSize || h.HeaderLen > len(b) || h.Len < h.HeaderLen {
			return h, ErrBadLength
		}
		return h, nil
	case header.IPv6Version:
		if len(b) < header.IPv6MinimumSize {
			return IP{IPv6: true}, ErrTruncated
		}
		return ipv6Fields(header.IPv6(b)), nil
	}
	return IP{}, ErrNotIP
}

// IPv4Lengths reads the lengths of the IPv4 header at the front of b: its
// header length hl and total length n, and whether b holds a whole IPv4
// packet whose lengths hold together (what ParseIP accepts). It is the
// fast path of ParseIP and ParseHeaders, for a caller that knows the
// version and needs no more: it inlines, and returns scalars, which stay
// in registers where a struct of more than four fields goes through
// memory. ParseIP says what is wrong with a packet it refuses.
func IPv4Lengths(b []byte) (hl, n int, ok bool) {
	// The version nibble read as header.IPVersion reads it, without the
	// length check just made: the call's cost would keep callers such as
	// the engine's validIPv4 from inlining this.
	if len(b) < header.IPv4MinimumSize || b[0]>>4 != header.IPv4Version {
		return 0, 0, false
	}
	ip := header.IPv4(b)
	hl, n = int(ip.HeaderLength()), int(ip.TotalLength())
	return hl, n, hl >= header.IPv4MinimumSize && hl <= n && n <= len(b)
}

// IPv6Length is IPv4Lengths for IPv6, whose header length is fixed
// (extension headers are not walked): n is the packet's length.
func IPv6Length(b []byte) (n int, ok bool) {
	if len(b) < header.IPv6MinimumSize || header.IPVersion(b) != header.IPv6Version {
		return 0, false
	}
	n = header.IPv6MinimumSize + int(header.IPv6(b).PayloadLength())
	return n, n <= len(b)
}

// fragmented reports whether the IPv4 header ip is that of a fragment
// (more fragments follow, or it is not the first).
func fragmented(ip header.IPv4) bool {
	return ip.Flags()&header.IPv4FlagMoreFragments != 0 || ip.FragmentOffset() != 0
}

// ipv6Fields reads what IP holds from the fixed IPv6 header ip (at least
// IPv6MinimumSize bytes); the payload length needs no check against the
// header.
func ipv6Fields(ip header.IPv6) IP {
	return IP{
		IPv6:      true,
		HeaderLen: header.IPv6MinimumSize,
		Len:       header.IPv6MinimumSize + int(ip.PayloadLength()),
		Protocol:  ip.NextHeader(),
	}
}

// TransportLen returns the length of the TCP header (options included)
// or UDP header at the front of l4, which ends where the IP packet ends.
func TransportLen(proto uint8, l4 []byte) (int, error) {
	if n := transportLen(proto, l4); n > 0 {
		return n, nil
	}
	if proto != ProtoTCP && proto != ProtoUDP {
		return 0, ErrNotTransport
	}
	return 0, ErrTruncated
}

// transportLen is TransportLen without the error: 0 when l4 holds no
// whole TCP or UDP header (neither has fewer than eight bytes), so that
// ParseHeaders carries no error value on its fast path.
func transportLen(proto uint8, l4 []byte) int {
	switch proto {
	case ProtoTCP:
		if len(l4) >= header.TCPMinimumSize {
			if n := int(header.TCP(l4).DataOffset()); n >= header.TCPMinimumSize && n <= len(l4) {
				return n
			}
		}
	case ProtoUDP:
		if len(l4) >= header.UDPMinimumSize {
			return header.UDPMinimumSize
		}
	}
	return 0
}
