package soak

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"

	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// The soak's packets are IPv4/UDP frames whose UDP payload starts with a
// soakHeader: which flow the packet belongs to, its sequence number in that
// flow, its length and a CRC-32C over everything else, so the receiving
// host can tell a corrupted, truncated, duplicated or reordered packet
// from a good one without any shared state with the sender.

const (
	soakMagic      uint32 = 0x534f414b // "SOAK"
	soakHdrLen            = 24         // magic, src, dst, seq, len, crc
	soakUDPPort           = 4755       // RFC 4755, both ports
	soakIPOverhead        = header.IPv4MinimumSize + header.UDPMinimumSize
	// soakMinIP is the smallest IP packet the soak sends.
	soakMinIP = soakIPOverhead + soakHdrLen
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of parseSoakPacket; the host counts each under its own name.
var (
	ErrNotOurs   = errors.New("soak: not a soak packet")
	ErrTruncated = errors.New("soak: packet truncated")
	ErrLength    = errors.New("soak: length field does not match")
	ErrChecksum  = errors.New("soak: payload checksum mismatch")
)

// soakPacket is what a receiver learns from one soak packet.
type soakPacket struct {
	Src, Dst uint16 // host indices: the flow
	Seq      uint64
	Len      int // UDP payload length, header included
	SrcIP    netip.Addr
	DstIP    netip.Addr
}

// soakHostIP is host k's IPv4 address (10.77.0.0/16, .0 and .255 avoided
// so no address looks like a broadcast).
func soakHostIP(k int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 77, byte(k / 250), byte(k%250 + 1)})
}

// soakHostIndex inverts soakHostIP.
func soakHostIndex(a netip.Addr) (int, bool) {
	if !a.Is4() {
		return 0, false
	}
	b := a.As4()
	if b[0] != 10 || b[1] != 77 || b[3] == 0 || b[3] > 250 {
		return 0, false
	}
	return int(b[2])*250 + int(b[3]) - 1, true
}

// putSoakIPv4 writes an IPv4/UDP soak packet of ipLen bytes into b (which
// must hold ipLen bytes) and returns ipLen. The body is a pattern derived
// from the sequence number, so every byte is covered by the checksum and
// differs between neighbouring packets.
func putSoakIPv4(b []byte, src, dst uint16, seq uint64, ipLen int) int {
	if ipLen < soakMinIP || len(b) < ipLen || ipLen > 0xffff {
		return 0
	}
	ip := header.IPv4(b[:header.IPv4MinimumSize])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(ipLen),
		ID:          uint16(seq),
		Flags:       header.IPv4FlagDontFragment, // the soak never fragments
		TTL:         64,
		Protocol:    packet.ProtoUDP,
		SrcAddr:     tcpip.AddrFrom4(soakHostIP(int(src)).As4()),
		DstAddr:     tcpip.AddrFrom4(soakHostIP(int(dst)).As4()),
	})
	packet.PutIPv4Checksum(ip)

	udp := header.UDP(b[header.IPv4MinimumSize:ipLen])
	udp.Encode(&header.UDPFields{
		SrcPort: soakUDPPort, DstPort: soakUDPPort, Length: uint16(len(udp)),
		// No UDP checksum (IPv4 allows it): the soak header's CRC is stronger.
	})

	p := udp[header.UDPMinimumSize:]
	binary.BigEndian.PutUint32(p[0:4], soakMagic)
	binary.BigEndian.PutUint16(p[4:6], src)
	binary.BigEndian.PutUint16(p[6:8], dst)
	binary.BigEndian.PutUint64(p[8:16], seq)
	binary.BigEndian.PutUint32(p[16:20], uint32(len(p)))
	body := p[soakHdrLen:]
	x := byte(seq*131 + 7)
	for k := range body {
		body[k] = x
		x = x*5 + 1
	}
	binary.BigEndian.PutUint32(p[20:24], soakCRC(p))
	return ipLen
}

// soakCRC covers the soak header without its CRC field, and the body.
func soakCRC(p []byte) uint32 {
	c := crc32.Update(0, castagnoli, p[:20])
	return crc32.Update(c, castagnoli, p[soakHdrLen:])
}

// parseSoakIPv4 checks an IPv4 packet from the host side and returns the
// soak packet it carries. It never panics: every malformed input returns
// an error.
func parseSoakIPv4(b []byte) (soakPacket, error) {
	h, err := packet.ParseIP(b)
	switch {
	case errors.Is(err, packet.ErrNotIP), errors.Is(err, packet.ErrTruncated), h.IPv6:
		return soakPacket{}, fmt.Errorf("IPv4 header: %w", ErrNotOurs)
	case err != nil:
		return soakPacket{}, fmt.Errorf("IPv4 lengths ihl %d total %d of %d: %w", h.HeaderLen, h.Len, len(b), ErrTruncated)
	case h.Protocol != packet.ProtoUDP:
		return soakPacket{}, fmt.Errorf("IP protocol %d: %w", h.Protocol, ErrNotOurs)
	case !packet.IPv4ChecksumValid(b):
		return soakPacket{}, fmt.Errorf("IPv4 header: %w", ErrChecksum)
	}
	ip := header.IPv4(b)
	udp := header.UDP(b[h.HeaderLen:h.Len])
	if len(udp) < header.UDPMinimumSize {
		return soakPacket{}, fmt.Errorf("UDP header: %w", ErrTruncated)
	}
	if udp.DestinationPort() != soakUDPPort {
		return soakPacket{}, fmt.Errorf("UDP port: %w", ErrNotOurs)
	}
	if int(udp.Length()) != len(udp) {
		return soakPacket{}, fmt.Errorf("UDP length %d of %d: %w", udp.Length(), len(udp), ErrLength)
	}
	p := udp.Payload()
	if len(p) < soakHdrLen {
		return soakPacket{}, fmt.Errorf("soak header: %w", ErrTruncated)
	}
	if binary.BigEndian.Uint32(p[0:4]) != soakMagic {
		return soakPacket{}, fmt.Errorf("magic: %w", ErrNotOurs)
	}
	if int(binary.BigEndian.Uint32(p[16:20])) != len(p) {
		return soakPacket{}, fmt.Errorf("soak length %d of %d: %w", binary.BigEndian.Uint32(p[16:20]), len(p), ErrLength)
	}
	if soakCRC(p) != binary.BigEndian.Uint32(p[20:24]) {
		return soakPacket{}, fmt.Errorf("soak payload: %w", ErrChecksum)
	}
	return soakPacket{
		Src:   binary.BigEndian.Uint16(p[4:6]),
		Dst:   binary.BigEndian.Uint16(p[6:8]),
		Seq:   binary.BigEndian.Uint64(p[8:16]),
		Len:   len(p),
		SrcIP: netip.AddrFrom4(ip.SourceAddress().As4()),
		DstIP: netip.AddrFrom4(ip.DestinationAddress().As4()),
	}, nil
}
