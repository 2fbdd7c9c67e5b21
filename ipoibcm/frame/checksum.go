package frame

import "encoding/binary"

// The Internet checksum (RFC 1071), kept unfolded in a uint64 so pieces can
// be added without carrying on every word. Every piece but the last must
// have even length, which holds for the headers summed here.

func checksumAdd(sum uint64, b []byte) uint64 {
	for len(b) >= 8 {
		sum += uint64(binary.BigEndian.Uint32(b[0:4])) + uint64(binary.BigEndian.Uint32(b[4:8]))
		b = b[8:]
	}
	for len(b) >= 2 {
		sum += uint64(binary.BigEndian.Uint16(b[0:2]))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	return sum
}

func checksumFold(sum uint64) uint16 {
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}

// ipv6PseudoHeaderSum is the upper-layer pseudo-header of RFC 8200 §8.1
// for a payload of the given length and next header.
func ipv6PseudoHeaderSum(src, dst []byte, length int, nextHeader uint8) uint64 {
	sum := checksumAdd(0, src[:16])
	sum = checksumAdd(sum, dst[:16])
	return sum + uint64(length>>16) + uint64(length&0xffff) + uint64(nextHeader)
}
