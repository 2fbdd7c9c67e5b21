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
// It is ReadHeaders with the reason for a refusal; the datapath, which
// needs no reason, reads with ReadHeaders (offload.ReadHeaders).
func ParseHeaders(frame []byte, l3off int) (Headers, error) {
	h, ip, l4 := ReadHeaders(frame, l3off)
	if l4 {
		return h, nil
	}
	return h, headersError(frame, h, ip)
}

// ReadHeaders is ParseHeaders without the error value: ip reports that the
// IP header is whole and its lengths hold together (what IPv4Lengths or
// IPv6Length accept), l4 that ParseHeaders would return no error. h is
// what ParseHeaders returns. A caller that must tell a bad IP packet from
// a good one that is no whole TCP or UDP packet (an ICMP message, a
// fragment) reads both answers from one parse, and a refusal costs no
// error value: ParseHeaders' wraps the protocol number, an allocation per
// packet on a receive path carrying ICMP.
//
// A well-formed packet costs one call, this one: the IP and transport
// readers it uses inline.
func ReadHeaders(frame []byte, l3off int) (h Headers, ip, l4 bool) {
	if l3off < 0 || l3off >= len(frame) {
		return Headers{L3: l3off}, false, false
	}
	b := frame[l3off:]
	v6 := false
	var proto uint8
	hl, n, ok := IPv4Lengths(b)
	switch {
	case ok:
		ip := header.IPv4(b[:header.IPv4MinimumSize])
		if fragmented(ip) {
			return Headers{L3: l3off}, true, false
		}
		proto = ip.Protocol()
	default:
		if n, ok = IPv6Length(b); !ok {
			return Headers{L3: l3off}, false, false
		}
		v6, hl, proto = true, header.IPv6MinimumSize, header.IPv6(b).NextHeader()
	}
	h = Headers{L3: l3off, IPv6: v6, Proto: proto, L4: l3off + hl, Len: l3off + n}
	tl := transportLen(proto, b[hl:n])
	if tl == 0 {
		return h, true, false
	}
	h.End = h.L4 + tl
	return h, true, true
}

// headersError says why ReadHeaders refused frame, whose reading is h and
// ip: only ParseHeaders' callers pay for it.
func headersError(frame []byte, h Headers, ip bool) error {
	switch {
	case h.L3 < 0 || h.L3 >= len(frame):
		return ErrTruncated
	case !ip:
		_, err := parseIPError(frame[h.L3:])
		return err
	case h.L4 == 0:
		// ReadHeaders fills in no transport offset for a fragment.
		return errFragment
	}
	_, err := TransportLen(h.Proto, frame[h.L4:h.Len])
	return transportError(h.Proto, err)
}

var errFragment = fmt.Errorf("ipv4 fragment: %w", ErrNotTransport)

// transportError names the protocol of a payload that is not TCP or UDP.
func transportError(proto uint8, err error) error {
	if errors.Is(err, ErrNotTransport) {
		return fmt.Errorf("ip protocol %d: %w", proto, err)
	}
	return err
}
