package wire

import (
	"encoding/binary"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"hash/crc32"
	"math/bits"
)

// MaxGSOSegments is the most datagrams one UDP GSO send carries, and so
// the IPv4 Identification range [0, MaxGSOSegments) a receiver accepts:
// for an unconnected DF socket Linux gives the super-packet ID 0 and
// inet_gso_segment numbers the segments 0, 1, 2, ...
const MaxGSOSegments = 64

// ipv4IDOffset is where the Identification field sits in the IPv4 header.
const ipv4IDOffset = 4

// IDShift gives, for RoCEv2 packets of one length over IPv4, how the ICRC
// changes with the IPv4 Identification. The ICRC covers the ID, and a CRC
// is linear: crc(m ⊕ Δ) = crc(m) ⊕ raw(Δ) for messages of equal length,
// where raw is the CRC with zero initial value and no final inversion.
// Δ here is the ID in its two bytes followed by zeros to the end of the
// covered data, so raw(Δ) = raw(ID bytes) · x^(8·zeros) mod P, which is
// linear in the ID's bits: Delta(id) is the XOR of one basis value per
// set bit. Building one costs a few microseconds (the zlib crc32_combine
// "zeros operator"); Delta is a handful of XORs.
type IDShift struct {
	ipHdrLen, pktLen int
	basis            [16]uint32 // basis[b]: ICRC change of ID bit b
}

// NewIDShift prepares the ID shifts of packets with an IPv4 header of
// ipHdrLen bytes and pktLen bytes of UDP payload (the 4 ICRC bytes
// included).
func NewIDShift(ipHdrLen, pktLen int) IDShift {
	s := IDShift{ipHdrLen: ipHdrLen, pktLen: pktLen}
	// Bytes hashed after the ID field: the rest of the IP header, the UDP
	// header and the packet without its ICRC.
	zeros := max(ipHdrLen-ipv4IDOffset-2+UDPHeaderLen+pktLen-ICRCLen, 0)
	shift := x2nModP(uint64(zeros), 3)
	for b := range s.basis {
		var id [2]byte
		binary.BigEndian.PutUint16(id[:], 1<<b)
		s.basis[b] = multModP(shift, rawCRC(id[:]))
	}
	return s
}

// Matches reports whether s was built for these lengths.
func (s *IDShift) Matches(ipHdrLen, pktLen int) bool {
	return s.pktLen == pktLen && s.ipHdrLen == ipHdrLen && pktLen != 0
}

// Delta is what XORing into the ICRC of a packet computed with ID 0 turns
// it into the ICRC of the same packet with ID id.
func (s *IDShift) Delta(id uint16) uint32 {
	var d uint32
	for b := 0; id != 0; b, id = b+1, id>>1 {
		if id&1 != 0 {
			d ^= s.basis[b]
		}
	}
	return d
}

// MatchID finds the IPv4 ID in [0, MaxGSOSegments) that explains the
// difference diff between a packet's wire ICRC and the ICRC computed with
// ID 0. The basis values of distinct bits are independent (a CRC-32
// detects every burst of 32 bits or fewer), so no two IDs give the same
// delta: a match is exact and unique. It reports false for no match.
func (s *IDShift) MatchID(diff uint32) (uint16, bool) {
	if diff == 0 {
		return 0, true
	}
	// Gray code order: each step flips one bit, so one XOR per candidate.
	var d uint32
	for i := uint16(1); i < MaxGSOSegments; i++ {
		d ^= s.basis[bits.TrailingZeros16(i)]
		if d == diff {
			return i ^ i>>1, true
		}
	}
	return 0, false
}

// IDShiftCache keeps the IDShifts of the last few packet lengths: a data
// stream has one full-segment length and a few tail lengths. Not safe for
// concurrent use; each goroutine that checks or patches keeps its own.
type IDShiftCache struct {
	entries [4]IDShift
	next    int
}

// Get returns the shifts for these lengths, building them on a miss.
func (c *IDShiftCache) Get(ipHdrLen, pktLen int) *IDShift {
	for i := range c.entries {
		if c.entries[i].Matches(ipHdrLen, pktLen) {
			return &c.entries[i]
		}
	}
	e := &c.entries[c.next]
	c.next = (c.next + 1) % len(c.entries)
	*e = NewIDShift(ipHdrLen, pktLen)
	return e
}

// SetICRCID rewrites the ICRC of pkt (a whole UDP payload whose ICRC was
// computed for IPv4 ID 0) for ID id instead.
func SetICRCID(pkt []byte, ipHdrLen int, id uint16, c *IDShiftCache) {
	if len(pkt) < ICRCLen {
		return
	}
	SetICRCIDTail(pkt[len(pkt)-ICRCLen:], len(pkt), ipHdrLen, id, c)
}

// SetICRCIDTail is SetICRCID for a packet of pktLen bytes whose ICRC
// field is icrc (its last 4 bytes, wherever they are held).
func SetICRCIDTail(icrc []byte, pktLen, ipHdrLen int, id uint16, c *IDShiftCache) {
	if id == 0 || len(icrc) < ICRCLen || pktLen < ICRCLen {
		return
	}
	v := binary.LittleEndian.Uint32(icrc)
	binary.LittleEndian.PutUint32(icrc, v^c.Get(ipHdrLen, pktLen).Delta(id))
}

// CheckICRCGSO verifies the ICRC of an IPv4 packet received through a UDP
// socket, which hides the sender's IPv4 ID: ipHdr is the reconstructed
// header with ID 0, and the packet passes if its ICRC is right for
// exactly one ID in [0, MaxGSOSegments), which it returns. A GSO sender
// numbers its segments that way (docs/wire.md §4.6); any other ID, or
// any corruption, fails with DropBadICRC.
func CheckICRCGSO(ipHdr, udpHdr, pkt []byte, c *IDShiftCache) (uint16, error) {
	if len(pkt) < BTHLen+ICRCLen {
		return 0, DropTruncated
	}
	n := len(pkt) - ICRCLen
	got, err := ICRC(ipHdr, udpHdr, pkt[:n])
	if err != nil {
		return 0, err
	}
	diff := got ^ binary.LittleEndian.Uint32(pkt[n:])
	if diff == 0 {
		return 0, nil
	}
	if header.IPVersion(ipHdr) != header.IPv4Version {
		return 0, DropBadICRC
	}
	id, ok := c.Get(int(header.IPv4(ipHdr).HeaderLength()), len(pkt)).MatchID(diff)
	if !ok {
		return 0, DropBadICRC
	}
	return id, nil
}

// rawCRC is the IEEE CRC of b with zero initial value and no final
// inversion: the linear part of crc32.ChecksumIEEE.
func rawCRC(b []byte) uint32 {
	var crc uint32
	for _, v := range b {
		crc = crc32.IEEETable[byte(crc)^v] ^ crc>>8
	}
	return crc
}

// crcPoly is the reflected IEEE polynomial.
const crcPoly = 0xEDB88320

// multModP multiplies a and b modulo the CRC polynomial, in the reflected
// bit order CRC values use (zlib's multmodp).
func multModP(a, b uint32) uint32 {
	m := uint32(1) << 31
	var p uint32
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				return p
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ crcPoly
		} else {
			b >>= 1
		}
	}
}

// x2nTable[k] is x^(2^k) modulo P; computed once, read only.
var x2nTable = func() [32]uint32 {
	var t [32]uint32
	p := uint32(1) << 30 // x^1
	t[0] = p
	for k := 1; k < len(t); k++ {
		p = multModP(p, p)
		t[k] = p
	}
	return t
}()

// x2nModP returns x^(n·2^k) modulo P; with k = 3 that is the operator
// that appends n zero bytes to a raw CRC.
func x2nModP(n uint64, k uint) uint32 {
	p := uint32(1) << 31 // x^0
	for n != 0 {
		if n&1 != 0 {
			p = multModP(x2nTable[k&31], p)
		}
		n >>= 1
		k++
	}
	return p
}
