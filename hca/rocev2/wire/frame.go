package wire

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// RoCEv2Port is the IANA UDP destination port of RoCEv2.
const RoCEv2Port = 4791

// ipv4TTL is the TTL the Linux kernel uses for our unconnected sockets;
// it is masked in the ICRC, so any value works.
const ipv4TTL = 64

// PutIPv4Header writes the 20-byte IPv4 header a Linux unconnected UDP
// socket with IP_PMTUDISC_DO sends: ID 0, DF set, TTL 64, protocol UDP,
// with a valid header checksum. udpLen is the UDP header plus payload.
func PutIPv4Header(b []byte, src, dst netip.Addr, udpLen int) {
	_ = b[IPv4HeaderLen-1]
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(IPv4HeaderLen + udpLen),
		Flags:       header.IPv4FlagDontFragment,
		TTL:         ipv4TTL,
		Protocol:    packet.ProtoUDP,
		SrcAddr:     tcpip.AddrFrom4(src.Unmap().As4()),
		DstAddr:     tcpip.AddrFrom4(dst.Unmap().As4()),
	})
	packet.PutIPv4Checksum(ip)
}

// PutIPv6Header writes a 40-byte IPv6 header (traffic class and flow
// label 0, hop limit 64, next header UDP).
func PutIPv6Header(b []byte, src, dst netip.Addr, udpLen int) {
	_ = b[IPv6HeaderLen-1]
	header.IPv6(b).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(udpLen),
		TransportProtocol: header.UDPProtocolNumber,
		HopLimit:          64,
		SrcAddr:           tcpip.AddrFrom16(src.As16()),
		DstAddr:           tcpip.AddrFrom16(dst.As16()),
	})
}

// PutIPHeader writes an IPv4 header when src is IPv4 (or v4-mapped), else
// an IPv6 header, and returns the header length.
func PutIPHeader(b []byte, src, dst netip.Addr, udpLen int) int {
	if src.Unmap().Is4() {
		PutIPv4Header(b, src, dst, udpLen)
		return IPv4HeaderLen
	}
	PutIPv6Header(b, src, dst, udpLen)
	return IPv6HeaderLen
}

// PutUDPHeader writes a UDP header with a zero checksum, as rxe sends
// over IPv4 (the ICRC masks it anyway).
func PutUDPHeader(b []byte, sport, dport uint16, udpLen int) {
	_ = b[UDPHeaderLen-1]
	header.UDP(b).Encode(&header.UDPFields{SrcPort: sport, DstPort: dport, Length: uint16(udpLen)})
}

// udpChecksum is the checksum of the UDP datagram u (its checksum field
// zero) behind the IP header ip.
func udpChecksum(ip, u []byte) uint16 {
	c := ^packet.Sum(u, packet.PseudoHeaderSum(ip, header.IPVersion(ip) == header.IPv6Version, packet.ProtoUDP, len(u)))
	if c == 0 {
		c = 0xFFFF
	}
	return c
}

// AppendFrame appends a whole IP/UDP/RoCEv2 packet to dst: the IP header
// (IPv4 with ID 0 and DF, or IPv6, chosen by src), a UDP header with a
// valid checksum, pkt (a UDP payload whose last 4 bytes are the ICRC
// field) with its ICRC computed, and returns the extended slice.
// src and dst must be the same family. With ethernet set, a 14-byte
// Ethernet header with locally administered MACs comes first, for
// LINKTYPE_ETHERNET captures.
func AppendFrame(dstBuf []byte, src, dst netip.AddrPort, pkt []byte, ethernet bool) ([]byte, error) {
	sa, da := src.Addr().Unmap(), dst.Addr().Unmap()
	if sa.Is4() != da.Is4() {
		return dstBuf, DropGarbage
	}
	udpLen := UDPHeaderLen + len(pkt)
	ipLen := IPv6HeaderLen
	etherType := uint16(0x86DD)
	if sa.Is4() {
		ipLen, etherType = IPv4HeaderLen, 0x0800
	}
	ethLen := 0
	if ethernet {
		ethLen = 14
	}
	start := len(dstBuf)
	dstBuf = slices.Grow(dstBuf, ethLen+ipLen+udpLen)[:start+ethLen+ipLen+udpLen]
	f := dstBuf[start:]
	if ethernet {
		copy(f[0:6], []byte{0x02, 0, 0, 0, 0, 2})
		copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 1})
		binary.BigEndian.PutUint16(f[12:], etherType)
		f = f[ethLen:]
	}
	ip, u, p := f[:ipLen], f[ipLen:ipLen+UDPHeaderLen], f[ipLen+UDPHeaderLen:]
	PutIPHeader(ip, sa, da, udpLen)
	PutUDPHeader(u, src.Port(), dst.Port(), udpLen)
	copy(p, pkt)
	if err := PutICRC(ip, u, p); err != nil {
		return dstBuf[:start], err
	}
	header.UDP(u).SetChecksum(udpChecksum(ip, f[ipLen:]))
	return dstBuf, nil
}
