package wire

import (
	"encoding/binary"
	"hash/crc32"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// IP and UDP header sizes the ICRC covers.
const (
	IPv4HeaderLen = header.IPv4MinimumSize
	IPv6HeaderLen = header.IPv6MinimumSize
	UDPHeaderLen  = header.UDPMinimumSize
)

// crcAfterMaskedLRH is the running IEEE CRC after the eight 0xFF bytes that
// stand for the masked LRH (IBTA A17.8). Seeding with it saves hashing them
// per packet; rxe seeds its raw CRC with 0xdebb20e3, the same state.
var crcAfterMaskedLRH = crc32.Update(0, crc32.IEEETable, []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF})

// ICRC computes the invariant CRC of a RoCEv2 packet. ipHdr is the IPv4
// (with options) or IPv6 header as sent, udpHdr the 8-byte UDP header and
// ib the UDP payload without its trailing 4 ICRC bytes. The variant fields
// are masked in small stack copies of the headers; the payload is hashed
// in place. Malformed header lengths return DropTruncated.
func ICRC(ipHdr, udpHdr, ib []byte) (uint32, error) {
	if len(udpHdr) < UDPHeaderLen || len(ib) < BTHLen || len(ipHdr) == 0 {
		return 0, DropTruncated
	}
	crc := crcAfterMaskedLRH
	switch header.IPVersion(ipHdr) {
	case header.IPv4Version:
		ihl := int(header.IPv4(ipHdr).HeaderLength())
		if ihl < IPv4HeaderLen || len(ipHdr) < ihl {
			return 0, DropTruncated
		}
		var h [header.IPv4MaximumHeaderSize]byte
		copy(h[:], ipHdr[:ihl])
		m := header.IPv4(h[:])
		m.SetTOS(0xFF, 0)
		m.SetTTL(0xFF)
		m.SetChecksum(0xFFFF)
		crc = updateSmall(crc, h[:ihl])
	case header.IPv6Version:
		if len(ipHdr) < IPv6HeaderLen {
			return 0, DropTruncated
		}
		var h [IPv6HeaderLen]byte
		copy(h[:], ipHdr)
		// Traffic class and flow label (SetTOS keeps the version
		// nibble 6), hop limit.
		m := header.IPv6(h[:])
		m.SetTOS(0xFF, 0xFFFFF)
		m.SetHopLimit(0xFF)
		crc = updateSmall(crc, h[:])
	default:
		return 0, DropGarbage
	}
	var u [UDPHeaderLen]byte
	copy(u[:], udpHdr)
	header.UDP(u[:]).SetChecksum(0xFFFF)
	crc = updateSmall(crc, u[:])
	var bth [BTHLen]byte
	copy(bth[:], ib)
	bth[4] = 0xFF // FECN, BECN, resv6
	crc = updateSmall(crc, bth[:])
	return crc32.Update(crc, crc32.IEEETable, ib[BTHLen:]), nil
}

// PutICRC computes the ICRC of pkt (a whole UDP payload whose last 4 bytes
// are the ICRC field) and writes it little-endian into those bytes.
func PutICRC(ipHdr, udpHdr, pkt []byte) error {
	if len(pkt) < BTHLen+ICRCLen {
		return DropTruncated
	}
	n := len(pkt) - ICRCLen
	c, err := ICRC(ipHdr, udpHdr, pkt[:n])
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(pkt[n:], c)
	return nil
}

// PutICRCSplit is PutICRC for a packet held in two places, as a
// zero-copy send posts it: the wire bytes are head, then payload, then
// tail, whose last 4 bytes are the ICRC field. head holds at least the
// BTH.
func PutICRCSplit(ipHdr, udpHdr, head, payload, tail []byte) error {
	if len(head) < BTHLen || len(tail) < ICRCLen {
		return DropTruncated
	}
	n := len(tail) - ICRCLen
	c, err := ICRC(ipHdr, udpHdr, head)
	if err != nil {
		return err
	}
	c = crc32.Update(c, crc32.IEEETable, payload)
	c = crc32.Update(c, crc32.IEEETable, tail[:n])
	binary.LittleEndian.PutUint32(tail[n:], c)
	return nil
}

// CheckICRC verifies the ICRC of pkt; DropBadICRC on mismatch.
func CheckICRC(ipHdr, udpHdr, pkt []byte) error {
	if len(pkt) < BTHLen+ICRCLen {
		return DropTruncated
	}
	n := len(pkt) - ICRCLen
	c, err := ICRC(ipHdr, udpHdr, pkt[:n])
	if err != nil {
		return err
	}
	if c != binary.LittleEndian.Uint32(pkt[n:]) {
		return DropBadICRC
	}
	return nil
}

// updateSmall continues an IEEE CRC over a few bytes (the masked
// headers, at most 60 bytes at a time) eight at a time with slicing-by-8
// tables, the rest byte-wise. The masked header copies live on the
// stack; handing them to crc32.Update (an indirect call) would make them
// escape and allocate, and its table walk is byte-wise below 64 bytes
// anyway: per packet this was a sixth of the ICRC's time.
func updateSmall(crc uint32, b []byte) uint32 {
	crc = ^crc
	t := &slicing8
	for len(b) >= 8 {
		crc ^= binary.LittleEndian.Uint32(b)
		crc = t[0][b[7]] ^ t[1][b[6]] ^ t[2][b[5]] ^ t[3][b[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xFF] ^ t[6][crc>>8&0xFF] ^ t[7][crc&0xFF]
		b = b[8:]
	}
	for _, v := range b {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// slicing8 are the IEEE slicing-by-8 tables: slicing8[0] is
// crc32.IEEETable, slicing8[k][i] the CRC of byte i followed by k zero
// bytes.
var slicing8 = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := range 256 {
		c := t[0][i]
		for k := 1; k < 8; k++ {
			c = t[0][c&0xFF] ^ c>>8
			t[k][i] = c
		}
	}
	return t
}()
