package soak

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
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
	ipv4HdrLen            = 20
	udpHdrLen             = 8
	soakIPOverhead        = ipv4HdrLen + udpHdrLen
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
	ip := b[:ipv4HdrLen]
	ip[0] = 0x45
	ip[1] = 0
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipLen))
	binary.BigEndian.PutUint16(ip[4:6], uint16(seq))
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF: the soak never fragments
	ip[8] = 64
	ip[9] = 17 // UDP
	ip[10], ip[11] = 0, 0
	s, d := soakHostIP(int(src)).As4(), soakHostIP(int(dst)).As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], ipv4Checksum(ip))

	udp := b[ipv4HdrLen:ipLen]
	binary.BigEndian.PutUint16(udp[0:2], soakUDPPort)
	binary.BigEndian.PutUint16(udp[2:4], soakUDPPort)
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(udp)))
	udp[6], udp[7] = 0, 0 // no UDP checksum (IPv4 allows it); ours is stronger

	p := udp[udpHdrLen:]
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
func parseSoakIPv4(ip []byte) (soakPacket, error) {
	if len(ip) < ipv4HdrLen || ip[0]>>4 != 4 {
		return soakPacket{}, fmt.Errorf("IPv4 header: %w", ErrNotOurs)
	}
	ihl := int(ip[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if ihl < ipv4HdrLen || total < ihl || total > len(ip) {
		return soakPacket{}, fmt.Errorf("IPv4 lengths ihl %d total %d of %d: %w", ihl, total, len(ip), ErrTruncated)
	}
	if ip[9] != 17 {
		return soakPacket{}, fmt.Errorf("IP protocol %d: %w", ip[9], ErrNotOurs)
	}
	if ipv4Checksum(ip[:ihl]) != 0 {
		return soakPacket{}, fmt.Errorf("IPv4 header: %w", ErrChecksum)
	}
	udp := ip[ihl:total]
	if len(udp) < udpHdrLen {
		return soakPacket{}, fmt.Errorf("UDP header: %w", ErrTruncated)
	}
	if binary.BigEndian.Uint16(udp[2:4]) != soakUDPPort {
		return soakPacket{}, fmt.Errorf("UDP port: %w", ErrNotOurs)
	}
	if int(binary.BigEndian.Uint16(udp[4:6])) != len(udp) {
		return soakPacket{}, fmt.Errorf("UDP length %d of %d: %w", binary.BigEndian.Uint16(udp[4:6]), len(udp), ErrLength)
	}
	p := udp[udpHdrLen:]
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
		SrcIP: netip.AddrFrom4([4]byte(ip[12:16])),
		DstIP: netip.AddrFrom4([4]byte(ip[16:20])),
	}, nil
}

// ipv4Checksum is the Internet checksum of h; 0 over a header whose
// checksum field is correct.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for k := 0; k+1 < len(h); k += 2 {
		sum += uint32(h[k])<<8 | uint32(h[k+1])
	}
	if len(h)%2 == 1 {
		sum += uint32(h[len(h)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
