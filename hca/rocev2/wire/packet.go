package wire

import (
	"encoding/binary"
	"slices"
)

// Packet is a decoded RoCEv2 transport packet. Payload aliases the input.
type Packet struct {
	BTH     BTH
	DETH    DETH // valid when BTH.Opcode is OpUDSendOnly
	AETH    AETH // valid when BTH.Opcode is OpRCAck
	Payload []byte
	// ICRC is the CRC value as carried (little-endian on the wire).
	ICRC uint32
}

// ParsePacket decodes the UDP payload b of a RoCEv2 datagram into p. It
// checks the version, opcode, lengths and pad count, but not the ICRC
// (which needs the IP and UDP headers; see ICRC). The returned error is a
// DropReason.
func ParsePacket(b []byte, p *Packet) error {
	if len(b) < BTHLen+ICRCLen {
		return DropGarbage
	}
	if err := p.BTH.Decode(b); err != nil {
		return err
	}
	if p.BTH.TVer != 0 {
		return DropBadTVer
	}
	if !p.BTH.Opcode.Supported() {
		return DropBadOpcode
	}
	body := b[BTHLen : len(b)-ICRCLen]
	p.ICRC = binary.LittleEndian.Uint32(b[len(b)-ICRCLen:])
	ext := p.BTH.Opcode.extLen()
	if len(body) < ext {
		return DropTruncated
	}
	switch p.BTH.Opcode {
	case OpUDSendOnly:
		_ = p.DETH.Decode(body)
	case OpRCAck:
		_ = p.AETH.Decode(body)
	}
	body = body[ext:]
	pad := int(p.BTH.PadCount)
	if pad > len(body) {
		return DropBadPadCount
	}
	p.Payload = body[:len(body)-pad]
	return nil
}

// PacketSpec describes a packet for AppendPacket.
type PacketSpec struct {
	BTH     BTH
	DETH    DETH
	AETH    AETH
	Payload []byte
}

// HeaderLen returns the bytes before the payload for opcode op.
func HeaderLen(op Opcode) int { return BTHLen + op.extLen() }

// PacketLen returns the UDP payload length of a packet of opcode op that
// carries n payload bytes: headers, payload, pad and ICRC.
func PacketLen(op Opcode, n int) int {
	return HeaderLen(op) + n + int(PadCount(n)) + ICRCLen
}

// EncodeHeaders writes the BTH (with the pad count for a payload of n
// bytes) and the opcode's extended header into b, and returns the header
// length. The caller writes the payload at b[HeaderLen:], then calls
// Finish.
func EncodeHeaders(b []byte, s *PacketSpec, n int) int {
	bth := s.BTH
	bth.PadCount = PadCount(n)
	bth.Encode(b)
	switch bth.Opcode {
	case OpUDSendOnly:
		s.DETH.Encode(b[BTHLen:])
	case OpRCAck:
		s.AETH.Encode(b[BTHLen:])
	case OpCNP:
		clear(b[BTHLen : BTHLen+cnpReservedLen])
	}
	return BTHLen + bth.Opcode.extLen()
}

// AppendPacket appends the packet described by s to dst, with zero pad
// bytes and a zero ICRC placeholder, and returns the extended slice. Use
// PutICRC afterwards to fill the ICRC.
func AppendPacket(dst []byte, s *PacketSpec) []byte {
	n := len(s.Payload)
	total := PacketLen(s.BTH.Opcode, n)
	start := len(dst)
	dst = slices.Grow(dst, total)[:start+total]
	b := dst[start:]
	h := EncodeHeaders(b, s, n)
	copy(b[h:], s.Payload)
	// Pad bytes and the ICRC placeholder must be zero, whatever the
	// grown capacity held before.
	clear(b[h+n:])
	return dst
}
