package frame

import (
	"net/netip"

	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Constants of the ICMP errors BuildTooBig synthesises that gVisor's
// header package does not name.
const (
	// ipv4TOSInternetControl is the precedence Linux gives ICMP errors.
	ipv4TOSInternetControl = 0xc0
	errorHopLimit          = 64

	// icmpv6InfoMask: ICMPv6 types below 128 are errors (RFC 4443 §2.1).
	icmpv6InfoMask = 0x80

	// icmpv4MaxErrorLen bounds an ICMPv4 error datagram as Linux does
	// (576, RFC 1812 §4.3.2.3); icmpv6MaxErrorLen is the IPv6 minimum MTU
	// (RFC 4443 §2.4(c)).
	icmpv4MaxErrorLen = 576
	icmpv6MaxErrorLen = 1280

	ipv4MinMTU = 68
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
	switch header.IPVersion(offending) {
	case header.IPv4Version:
		return buildFragNeeded(dst, hostMAC, srcMAC, offending, mtu)
	case header.IPv6Version:
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
	if mtu < ipv4MinMTU || mtu > 0xffff {
		return 0
	}
	h, err := packet.ParseIPHeader(pkt)
	if err != nil || h.IPv6 {
		return 0
	}
	off := header.IPv4(pkt)
	if off.Flags()&header.IPv4FlagDontFragment == 0 || off.FragmentOffset() != 0 {
		return 0
	}
	src, to := [4]byte(off.SourceAddressSlice()), [4]byte(off.DestinationAddressSlice())
	if toAddr := netip.AddrFrom4(to); !ipv4SingleHost(src) ||
		toAddr.IsMulticast() || toAddr.IsUnspecified() || to == [4]byte{255, 255, 255, 255} {
		return 0
	}
	avail := min(h.Len, len(pkt))
	if h.Protocol == packet.ProtoICMPv4 && (avail <= h.HeaderLen || icmpv4IsError(pkt[h.HeaderLen])) {
		return 0
	}

	const headers = EthHdrLen + header.IPv4MinimumSize + header.ICMPv4MinimumSize
	quote := min(avail, icmpv4MaxErrorLen-header.IPv4MinimumSize-header.ICMPv4MinimumSize, len(dst)-headers)
	if quote < min(avail, h.HeaderLen+8) {
		return 0
	}
	n := headers + quote
	PutEthernet(dst, EthHeader{Dst: hostMAC, Src: srcMAC, EtherType: EtherTypeIPv4})

	// ID and fragment 0: the error is at most 576 bytes, never fragmented.
	ip := header.IPv4(dst[EthHdrLen : EthHdrLen+header.IPv4MinimumSize])
	ip.Encode(&header.IPv4Fields{
		TOS:         ipv4TOSInternetControl,
		TotalLength: uint16(header.IPv4MinimumSize + header.ICMPv4MinimumSize + quote),
		TTL:         errorHopLimit,
		Protocol:    packet.ProtoICMPv4,
		SrcAddr:     tcpip.AddrFrom4(to),
		DstAddr:     tcpip.AddrFrom4(src),
	})
	packet.PutIPv4Checksum(ip)

	icmp := header.ICMPv4(dst[EthHdrLen+header.IPv4MinimumSize : n])
	icmp.SetType(header.ICMPv4DstUnreachable)
	icmp.SetCode(header.ICMPv4FragmentationNeeded)
	clear(icmp[2:6]) // checksum, then the unused field of RFC 1191
	icmp.SetMTU(uint16(mtu))
	copy(icmp[header.ICMPv4MinimumSize:], pkt[:quote])
	icmp.SetChecksum(^packet.Sum(icmp, 0))
	return n
}

// ipv6IneligibleForError follows Linux is_ineligible: walk the extension
// headers of the quoted part and refuse an ICMPv6 error (or an ICMPv6
// message whose type cannot be seen, unless it is a later fragment). A chain
// that cannot be walked does not prevent the error.
func ipv6IneligibleForError(pkt []byte) bool {
	proto, off, fragOff, ok := packet.IPv6UpperLayer(pkt)
	switch {
	case !ok || proto != packet.ProtoICMPv6:
		return false
	case off >= len(pkt):
		return fragOff == 0
	}
	return pkt[off]&icmpv6InfoMask == 0
}

func buildPacketTooBig(dst []byte, hostMAC, srcMAC MAC, pkt []byte, mtu int) int {
	if mtu < ipv4MinMTU || uint64(mtu) > 0xffffffff {
		return 0
	}
	h, err := packet.ParseIPHeader(pkt)
	if err != nil || !h.IPv6 {
		return 0
	}
	off := header.IPv6(pkt)
	src, to := netip.AddrFrom16([16]byte(off.SourceAddressSlice())), netip.AddrFrom16([16]byte(off.DestinationAddressSlice()))
	if src.IsUnspecified() || src.IsMulticast() || src.IsLoopback() || to.IsMulticast() || to.IsUnspecified() {
		return 0
	}
	avail := min(h.Len, len(pkt))
	if ipv6IneligibleForError(pkt[:avail]) {
		return 0
	}

	const headers = EthHdrLen + header.IPv6MinimumSize + header.ICMPv6MinimumSize
	quote := min(avail, icmpv6MaxErrorLen-header.IPv6MinimumSize-header.ICMPv6MinimumSize, len(dst)-headers)
	if quote < min(avail, header.IPv6MinimumSize+8) {
		return 0
	}
	n := headers + quote
	PutEthernet(dst, EthHeader{Dst: hostMAC, Src: srcMAC, EtherType: EtherTypeIPv6})

	ip := header.IPv6(dst[EthHdrLen : EthHdrLen+header.IPv6MinimumSize])
	ip.Encode(&header.IPv6Fields{
		PayloadLength:     uint16(header.ICMPv6MinimumSize + quote),
		TransportProtocol: header.ICMPv6ProtocolNumber,
		HopLimit:          errorHopLimit,
		SrcAddr:           off.DestinationAddress(),
		DstAddr:           off.SourceAddress(),
	})

	icmp := header.ICMPv6(dst[EthHdrLen+header.IPv6MinimumSize : n])
	icmp.SetType(header.ICMPv6PacketTooBig)
	icmp.SetCode(0)
	icmp.SetChecksum(0)
	icmp.SetMTU(uint32(mtu))
	copy(icmp[header.ICMPv6MinimumSize:], pkt[:quote])
	icmp.SetChecksum(^packet.Sum(icmp, packet.PseudoHeaderSum(ip, true, packet.ProtoICMPv6, len(icmp))))
	return n
}
