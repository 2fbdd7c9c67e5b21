package frame

import (
	"encoding/binary"
	"net/netip"
)

// Constants of the ICMP errors BuildTooBig synthesises.
const (
	ipv4MinHeaderLen   = 20
	ipProtoICMPv4      = 1
	ipv4FlagDF         = 0x4000
	ipv4FragOffsetMask = 0x1fff
	// ipv4TOSInternetControl is the precedence Linux gives ICMP errors.
	ipv4TOSInternetControl = 0xc0
	icmpHeaderLen          = 8
	errorHopLimit          = 64

	icmpv4DestUnreachable = 3
	icmpv4FragNeeded      = 4
	icmpv6PacketTooBig    = 2
	// icmpv6InfoMask: ICMPv6 types below 128 are errors (RFC 4443 §2.1).
	icmpv6InfoMask = 0x80

	// icmpv4MaxErrorLen bounds an ICMPv4 error datagram as Linux does
	// (576, RFC 1812 §4.3.2.3); icmpv6MaxErrorLen is the IPv6 minimum MTU
	// (RFC 4443 §2.4(c)).
	icmpv4MaxErrorLen = 576
	icmpv6MaxErrorLen = 1280

	ipv4MinMTU = 68

	ipv6ExtHopByHop = 0
	ipv6ExtRouting  = 43
	ipv6ExtFragment = 44
	ipv6ExtAH       = 51
	ipv6ExtDestOpts = 60
)

// BuildTooBig writes into dst a complete Ethernet frame for the host
// (destination hostMAC, source srcMAC) that reports the IP packet offending
// as too big for a path of IP MTU mtu: ICMP type 3 code 4 "fragmentation
// needed" for IPv4, ICMPv6 type 2 "packet too big" for IPv6. The error comes
// from the offending packet's destination and quotes as much of the packet
// as RFC 1812 (576-byte datagram) or RFC 4443 (1280) allow and dst holds.
//
// It returns the frame length, or 0 when no error may be sent: IPv4 without
// DF or a non-initial fragment; a packet that is itself an ICMP error; a
// source that is not a single host; an unspecified destination; an IPv4
// multicast or broadcast destination, or an IPv6 multicast one (the reply
// would need a unicast source address of ours, which the Interface does not
// have); a malformed packet; an mtu outside [68, 65535] (IPv4) or [68, 2^32)
// (IPv6); dst too small for the headers plus the offending header and 8
// bytes. dst must not overlap offending.
func BuildTooBig(dst []byte, hostMAC, srcMAC MAC, offending []byte, mtu int) int {
	if len(offending) == 0 {
		return 0
	}
	switch offending[0] >> 4 {
	case 4:
		return buildFragNeeded(dst, hostMAC, srcMAC, offending, mtu)
	case 6:
		return buildPacketTooBig(dst, hostMAC, srcMAC, offending, mtu)
	}
	return 0
}

// ipv4SingleHost reports whether a may be the destination of an ICMP error
// (RFC 1812 §4.3.2.7: not zero, loopback, broadcast, multicast or class E).
func ipv4SingleHost(a [4]byte) bool {
	ip := netip.AddrFrom4(a)
	return !ip.IsUnspecified() && !ip.IsLoopback() && !ip.IsMulticast() && a[0] < 240
}

func icmpv4IsError(icmpType byte) bool {
	switch icmpType {
	case 3, 4, 5, 11, 12: // unreachable, source quench, redirect, time exceeded, parameter problem
		return true
	}
	return false
}

func buildFragNeeded(dst []byte, hostMAC, srcMAC MAC, pkt []byte, mtu int) int {
	if len(pkt) < ipv4MinHeaderLen || mtu < ipv4MinMTU || mtu > 0xffff {
		return 0
	}
	hlen := int(pkt[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(pkt[2:4]))
	if hlen < ipv4MinHeaderLen || hlen > len(pkt) || total < hlen {
		return 0
	}
	frag := binary.BigEndian.Uint16(pkt[6:8])
	if frag&ipv4FlagDF == 0 || frag&ipv4FragOffsetMask != 0 {
		return 0
	}
	src, to := [4]byte(pkt[12:16]), [4]byte(pkt[16:20])
	if toAddr := netip.AddrFrom4(to); !ipv4SingleHost(src) ||
		toAddr.IsMulticast() || toAddr.IsUnspecified() || to == [4]byte{255, 255, 255, 255} {
		return 0
	}
	avail := min(total, len(pkt))
	if pkt[9] == ipProtoICMPv4 && (avail <= hlen || icmpv4IsError(pkt[hlen])) {
		return 0
	}

	const headers = EthHdrLen + ipv4MinHeaderLen + icmpHeaderLen
	quote := min(avail, icmpv4MaxErrorLen-ipv4MinHeaderLen-icmpHeaderLen, len(dst)-headers)
	if quote < min(avail, hlen+8) {
		return 0
	}
	n := headers + quote
	PutEthernet(dst, EthHeader{Dst: hostMAC, Src: srcMAC, EtherType: EtherTypeIPv4})

	ip := dst[EthHdrLen : EthHdrLen+ipv4MinHeaderLen]
	ip[0], ip[1] = 0x45, ipv4TOSInternetControl
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4MinHeaderLen+icmpHeaderLen+quote))
	clear(ip[4:8]) // ID and fragment: the error is ≤ 576 bytes, never fragmented
	ip[8], ip[9] = errorHopLimit, ipProtoICMPv4
	clear(ip[10:12])
	copy(ip[12:16], to[:])
	copy(ip[16:20], src[:])
	binary.BigEndian.PutUint16(ip[10:12], ^checksumFold(checksumAdd(0, ip)))

	icmp := dst[EthHdrLen+ipv4MinHeaderLen : n]
	icmp[0], icmp[1] = icmpv4DestUnreachable, icmpv4FragNeeded
	clear(icmp[2:6]) // checksum, then the unused field of RFC 1191
	binary.BigEndian.PutUint16(icmp[6:8], uint16(mtu))
	copy(icmp[icmpHeaderLen:], pkt[:quote])
	binary.BigEndian.PutUint16(icmp[2:4], ^checksumFold(checksumAdd(0, icmp)))
	return n
}

// ipv6IneligibleForError follows Linux is_ineligible: walk the extension
// headers of the quoted part and refuse an ICMPv6 error (or an ICMPv6
// message whose type cannot be seen, unless it is a later fragment). A chain
// that cannot be walked does not prevent the error.
func ipv6IneligibleForError(pkt []byte) bool {
	nh, off, fragOff := pkt[6], ipv6HeaderLen, uint16(0)
	for {
		switch nh {
		case ipv6ExtHopByHop, ipv6ExtRouting, ipv6ExtDestOpts, ipv6ExtAH, ipv6ExtFragment:
		case ipProtoICMPv6:
			if off >= len(pkt) {
				return fragOff == 0
			}
			return pkt[off]&icmpv6InfoMask == 0
		default:
			return false
		}
		if len(pkt)-off < 8 {
			return false
		}
		next := pkt[off]
		var hlen int
		switch nh {
		case ipv6ExtFragment:
			fragOff = binary.BigEndian.Uint16(pkt[off+2:off+4]) &^ 0x7
			hlen = 8
		case ipv6ExtAH:
			hlen = (int(pkt[off+1]) + 2) * 4
		default:
			hlen = (int(pkt[off+1]) + 1) * 8
		}
		nh, off = next, off+hlen
	}
}

func buildPacketTooBig(dst []byte, hostMAC, srcMAC MAC, pkt []byte, mtu int) int {
	if len(pkt) < ipv6HeaderLen || mtu < ipv4MinMTU || uint64(mtu) > 0xffffffff {
		return 0
	}
	src, to := netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40]))
	if src.IsUnspecified() || src.IsMulticast() || src.IsLoopback() || to.IsMulticast() || to.IsUnspecified() {
		return 0
	}
	avail := min(ipv6HeaderLen+int(binary.BigEndian.Uint16(pkt[4:6])), len(pkt))
	if ipv6IneligibleForError(pkt[:avail]) {
		return 0
	}

	const headers = EthHdrLen + ipv6HeaderLen + icmpHeaderLen
	quote := min(avail, icmpv6MaxErrorLen-ipv6HeaderLen-icmpHeaderLen, len(dst)-headers)
	if quote < min(avail, ipv6HeaderLen+8) {
		return 0
	}
	n := headers + quote
	PutEthernet(dst, EthHeader{Dst: hostMAC, Src: srcMAC, EtherType: EtherTypeIPv6})

	ip := dst[EthHdrLen : EthHdrLen+ipv6HeaderLen]
	binary.BigEndian.PutUint32(ip[0:4], 6<<28)
	binary.BigEndian.PutUint16(ip[4:6], uint16(icmpHeaderLen+quote))
	ip[6], ip[7] = ipProtoICMPv6, errorHopLimit
	copy(ip[8:24], pkt[24:40])
	copy(ip[24:40], pkt[8:24])

	icmp := dst[EthHdrLen+ipv6HeaderLen : n]
	icmp[0], icmp[1] = icmpv6PacketTooBig, 0
	clear(icmp[2:4])
	binary.BigEndian.PutUint32(icmp[4:8], uint32(mtu))
	copy(icmp[icmpHeaderLen:], pkt[:quote])
	sum := ipv6PseudoHeaderSum(ip[8:24], ip[24:40], len(icmp), ipProtoICMPv6)
	binary.BigEndian.PutUint16(icmp[2:4], ^checksumFold(checksumAdd(sum, icmp)))
	return n
}
