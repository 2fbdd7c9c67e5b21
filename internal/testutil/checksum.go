package testutil

import (
	"encoding/binary"
	"fmt"
)

// NaiveSum is the folded Internet checksum sum (RFC 1071) of the parts
// taken as one byte string, written the slow obvious way so that tests
// check the project's sums (gVisor's, eight bytes at a time) against
// something independent of them. Bytes carrying a correct checksum sum to
// 0xFFFF.
func NaiveSum(parts ...[]byte) uint16 {
	var s uint32
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	for i := 0; i+1 < len(all); i += 2 {
		s += uint32(all[i])<<8 | uint32(all[i+1])
	}
	if len(all)%2 == 1 {
		s += uint32(all[len(all)-1]) << 8
	}
	for s > 0xFFFF {
		s = s>>16 + s&0xFFFF
	}
	return uint16(s)
}

// NaiveChecksumError checks, with NaiveSum, the IPv4 header checksum and
// the TCP or UDP checksum (over its pseudo-header) of the whole IPv4 or
// IPv6 packet ip, and says what is wrong; nil if both are right. ip must
// hold the packet its length fields describe.
func NaiveChecksumError(ip []byte) error {
	var l4, pseudo []byte
	var proto byte
	if ip[0]>>4 == 4 {
		ihl := int(ip[0]&0xF) * 4
		if s := NaiveSum(ip[:ihl]); s != 0xFFFF {
			return fmt.Errorf("IPv4 header checksum invalid: sum %#04x", s)
		}
		proto = ip[9]
		l4 = ip[ihl:binary.BigEndian.Uint16(ip[2:])]
		pseudo = append(pseudo, ip[12:20]...)
	} else {
		proto = ip[6]
		l4 = ip[40 : 40+binary.BigEndian.Uint16(ip[4:])]
		pseudo = append(pseudo, ip[8:40]...)
	}
	pseudo = append(pseudo, 0, proto, byte(len(l4)>>8), byte(len(l4)))
	if s := NaiveSum(pseudo, l4); s != 0xFFFF {
		return fmt.Errorf("protocol %d checksum invalid: sum %#04x", proto, s)
	}
	return nil
}
