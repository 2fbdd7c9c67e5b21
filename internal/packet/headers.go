package packet

import (
	"errors"
	"fmt"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Headers is where the IP and TCP/UDP headers of one packet lie inside a
// frame, as offsets from the frame's start.
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

// ParseHeaders finds the IPv4/IPv6 and TCP/UDP headers of the packet that
// starts at l3off in frame. It rejects IPv4 fragments and IPv6 extension
// headers (ErrNotTransport) and length fields that point past the frame.
// On a transport error all but End are filled in.
//
// A well-formed packet costs one call, this one: GRO parses every
// segment here (offload.Parse), and the IP and transport readers it
// uses inline.
func ParseHeaders(frame []byte, l3off int) (Headers, error) {
	if l3off < 0 || l3off >= len(frame) {
		return Headers{L3: l3off}, ErrTruncated
	}
	b := frame[l3off:]
	v6 := false
	var proto uint8
	hl, n, ok := IPv4Lengths(b)
	switch {
	case ok:
		ip := header.IPv4(b[:header.IPv4MinimumSize])
		if fragmented(ip) {
			return Headers{L3: l3off}, errFragment
		}
		proto = ip.Protocol()
	default:
		if n, ok = IPv6Length(b); !ok {
			_, err := parseIPError(b)
			return Headers{L3: l3off}, err
		}
		v6, hl, proto = true, header.IPv6MinimumSize, header.IPv6(b).NextHeader()
	}
	tl := transportLen(proto, b[hl:n])
	if tl == 0 {
		_, err := TransportLen(proto, b[hl:n])
		return Headers{L3: l3off, IPv6: v6, Proto: proto, L4: l3off + hl, Len: l3off + n}, transportError(proto, err)
	}
	return Headers{L3: l3off, IPv6: v6, Proto: proto, L4: l3off + hl, End: l3off + hl + tl, Len: l3off + n}, nil
}

var errFragment = fmt.Errorf("ipv4 fragment: %w", ErrNotTransport)

// transportError names the protocol of a payload that is not TCP or UDP.
func transportError(proto uint8, err error) error {
	if errors.Is(err, ErrNotTransport) {
		return fmt.Errorf("ip protocol %d: %w", proto, err)
	}
	return err
}
