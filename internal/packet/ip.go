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
	// ErrNotTransport: the IP payload is neither TCP nor UDP.
	ErrNotTransport = errors.New("not a TCP or UDP header")
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
func ParseIP(b []byte) (IP, error) {
	// The IPv4 case first and without a call: every packet of the data
	// path goes through here (offload.Parse per GRO segment).
	if len(b) >= header.IPv4MinimumSize && header.IPVersion(b) == header.IPv4Version {
		ip := header.IPv4(b)
		h := IP{
			HeaderLen: int(ip.HeaderLength()),
			Len:       int(ip.TotalLength()),
			Protocol:  ip.Protocol(),
			Fragment:  ip.More() || ip.FragmentOffset() != 0,
		}
		if h.HeaderLen < header.IPv4MinimumSize || h.HeaderLen > len(b) || h.Len < h.HeaderLen || h.Len > len(b) {
			return h, ErrBadLength
		}
		return h, nil
	}
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
	if len(b) == 0 {
		return IP{}, ErrTruncated
	}
	switch header.IPVersion(b) {
	case header.IPv4Version:
		return parseIPv4(header.IPv4(b))
	case header.IPv6Version:
		return parseIPv6(header.IPv6(b))
	}
	return IP{}, ErrNotIP
}

func parseIPv4(ip header.IPv4) (IP, error) {
	if len(ip) < header.IPv4MinimumSize {
		return IP{}, ErrTruncated
	}
	h := IP{
		HeaderLen: int(ip.HeaderLength()),
		Len:       int(ip.TotalLength()),
		Protocol:  ip.Protocol(),
		Fragment:  ip.More() || ip.FragmentOffset() != 0,
	}
	if h.HeaderLen < header.IPv4MinimumSize || h.HeaderLen > len(ip) || h.Len < h.HeaderLen {
		return h, ErrBadLength
	}
	return h, nil
}

func parseIPv6(ip header.IPv6) (IP, error) {
	if len(ip) < header.IPv6MinimumSize {
		return IP{IPv6: true}, ErrTruncated
	}
	return IP{
		IPv6:      true,
		HeaderLen: header.IPv6MinimumSize,
		Len:       header.IPv6MinimumSize + int(ip.PayloadLength()),
		Protocol:  ip.NextHeader(),
	}, nil
}

// TransportLen returns the length of the TCP header (options included)
// or UDP header at the front of l4, which ends where the IP packet ends.
func TransportLen(proto uint8, l4 []byte) (int, error) {
	switch proto {
	case ProtoTCP:
		if len(l4) < header.TCPMinimumSize {
			return 0, ErrTruncated
		}
		n := int(header.TCP(l4).DataOffset())
		if n < header.TCPMinimumSize || n > len(l4) {
			return 0, ErrTruncated
		}
		return n, nil
	case ProtoUDP:
		if len(l4) < header.UDPMinimumSize {
			return 0, ErrTruncated
		}
		return header.UDPMinimumSize, nil
	}
	return 0, ErrNotTransport
}
