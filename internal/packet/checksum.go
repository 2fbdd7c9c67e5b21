package packet

import (
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Sum is the Internet checksum (RFC 1071) of b added to the folded sum
// initial: gVisor's, which reads eight bytes at a time. Chain calls over
// pieces of even length; the one's complement of the result is what goes
// into a checksum field, and a packet that carries a valid one sums to
// 0xFFFF.
func Sum(b []byte, initial uint16) uint16 { return checksum.Checksum(b, initial) }

// PseudoHeaderSum is the folded sum of the TCP/UDP/ICMPv6 pseudo-header
// (RFC 793, RFC 768, RFC 8200 8.1) of the IP header ip (IPv6 when ipv6 is
// set) for an upper-layer packet of l4len bytes of protocol proto. The
// addresses are read in place; the caller has checked the header is whole.
func PseudoHeaderSum(ip []byte, ipv6 bool, proto uint8, l4len int) uint16 {
	var s uint16
	if ipv6 {
		s = checksum.Checksum(ip[8:40], 0)
	} else {
		s = checksum.Checksum(ip[12:20], 0)
	}
	s = checksum.Combine(s, uint16(proto))
	return checksum.Combine(s, checksum.Combine(uint16(l4len>>16), uint16(l4len)))
}

// PutIPv4Checksum writes the header checksum of the IPv4 header ip (its
// HeaderLength bytes), whatever the field held.
func PutIPv4Checksum(ip []byte) {
	h := header.IPv4(ip)
	h.SetChecksum(0)
	h.SetChecksum(^checksum.Checksum(ip[:h.HeaderLength()], 0))
}

// IPv4ChecksumValid reports whether the IPv4 header ip carries a valid
// header checksum.
func IPv4ChecksumValid(ip []byte) bool {
	return checksum.Checksum(ip[:header.IPv4(ip).HeaderLength()], 0) == 0xFFFF
}
