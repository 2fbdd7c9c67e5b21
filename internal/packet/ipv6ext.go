package packet

import "gvisor.dev/gvisor/pkg/tcpip/header"

// IPv6UpperLayer walks the extension headers of the IPv6 packet b (its
// fixed header whole) past hop-by-hop, routing, destination options,
// authentication and fragment headers to the first header that is none
// of them. It returns that header's protocol and offset, the fragment
// offset (in 8-byte units) of a fragment header on the way, 0 without
// one, and whether the chain could be walked: false when an extension
// header does not fit inside b. The offset may lie at or past the end of
// b when the last extension header ends there (a quote cut short).
func IPv6UpperLayer(b []byte) (proto uint8, off int, fragOff uint16, ok bool) {
	proto, off = header.IPv6(b).NextHeader(), header.IPv6MinimumSize
	for {
		var n int
		switch header.IPv6ExtensionHeaderIdentifier(proto) {
		case header.IPv6HopByHopOptionsExtHdrIdentifier, header.IPv6RoutingExtHdrIdentifier,
			header.IPv6DestinationOptionsExtHdrIdentifier:
			var ok bool
			if n, ok = optionsLen(b, off); !ok {
				return proto, off, fragOff, false
			}
		case header.IPv6AuthenticationExtHdrIdentifier:
			if len(b)-off < 8 {
				return proto, off, fragOff, false
			}
			n = (int(b[off+1]) + 2) * 4 // RFC 4302 2.2: in 4-byte units, less two
		case header.IPv6FragmentExtHdrIdentifier:
			if len(b)-off < header.IPv6FragmentHeaderSize {
				return proto, off, fragOff, false
			}
			fragOff, n = header.IPv6Fragment(b[off:]).FragmentOffset(), header.IPv6FragmentHeaderSize
		default:
			return proto, off, fragOff, true
		}
		proto, off = b[off], off+n
	}
}

// IPv6PastHopByHop is the header behind the fixed header of the IPv6
// packet b and at most one hop-by-hop options header, where MLD carries
// its Router Alert (RFC 3810 5): that header's protocol and offset, and
// whether a hop-by-hop header there fits inside b. Unlike IPv6UpperLayer
// it walks no further, so what follows a second extension header is that
// header's protocol. The offset may lie at or past the end of b.
func IPv6PastHopByHop(b []byte) (proto uint8, off int, ok bool) {
	proto, off = header.IPv6(b).NextHeader(), header.IPv6MinimumSize
	if header.IPv6ExtensionHeaderIdentifier(proto) != header.IPv6HopByHopOptionsExtHdrIdentifier {
		return proto, off, true
	}
	n, ok := optionsLen(b, off)
	if !ok {
		return proto, off, false
	}
	return b[off], off + n, true
}

// optionsLen is the length of the hop-by-hop, routing or destination
// options header at b[off:], and whether its first eight bytes (where
// the length is) lie inside b.
func optionsLen(b []byte, off int) (int, bool) {
	if len(b)-off < 8 {
		return 0, false
	}
	return (int(b[off+1]) + 1) * 8, true // RFC 8200 4.3: in 8-byte units, the first not counted
}
