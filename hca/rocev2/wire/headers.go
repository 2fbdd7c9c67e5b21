package wire

import "encoding/binary"

// Header lengths in bytes.
const (
	BTHLen  = 12
	DETHLen = 8
	AETHLen = 4
	ICRCLen = 4
	// cnpReservedLen is the 16 reserved bytes after a CNP's BTH.
	cnpReservedLen = 16
)

// PSNMask keeps the 24 bits of a packet sequence number.
const PSNMask = 0xFFFFFF

// BTH is the base transport header.
type BTH struct {
	Opcode   Opcode
	SE       bool  // solicited event
	MigReq   bool  // path migration state; 0 without APM
	PadCount uint8 // 0..3 pad bytes after the payload
	TVer     uint8 // transport header version, 0
	PKey     uint16
	// Resv8a holds FECN/BECN and six reserved bits; masked in the ICRC.
	Resv8a uint8
	DestQP uint32 // 24 bits
	AckReq bool
	PSN    uint32 // 24 bits
}

// Encode writes the BTH into b[:BTHLen]. b must be at least BTHLen long.
func (h *BTH) Encode(b []byte) {
	_ = b[BTHLen-1]
	b[0] = byte(h.Opcode)
	f := h.PadCount&3<<4 | h.TVer&0xF
	if h.SE {
		f |= 0x80
	}
	if h.MigReq {
		f |= 0x40
	}
	b[1] = f
	binary.BigEndian.PutUint16(b[2:], h.PKey)
	binary.BigEndian.PutUint32(b[4:], uint32(h.Resv8a)<<24|h.DestQP&PSNMask)
	psn := h.PSN & PSNMask
	if h.AckReq {
		psn |= 1 << 31
	}
	binary.BigEndian.PutUint32(b[8:], psn)
}

// Decode reads a BTH from b. It checks only the length; version and opcode
// checks belong to ParsePacket.
func (h *BTH) Decode(b []byte) error {
	if len(b) < BTHLen {
		return DropTruncated
	}
	h.Opcode = Opcode(b[0])
	h.SE = b[1]&0x80 != 0
	h.MigReq = b[1]&0x40 != 0
	h.PadCount = b[1] >> 4 & 3
	h.TVer = b[1] & 0xF
	h.PKey = binary.BigEndian.Uint16(b[2:])
	w := binary.BigEndian.Uint32(b[4:])
	h.Resv8a = uint8(w >> 24)
	h.DestQP = w & PSNMask
	w = binary.BigEndian.Uint32(b[8:])
	h.AckReq = w>>31 != 0
	h.PSN = w & PSNMask
	return nil
}

// DETH is the datagram extended transport header of UD packets.
type DETH struct {
	QKey  uint32
	SrcQP uint32 // 24 bits
}

// Encode writes the DETH into b[:DETHLen].
func (h *DETH) Encode(b []byte) {
	_ = b[DETHLen-1]
	binary.BigEndian.PutUint32(b, h.QKey)
	binary.BigEndian.PutUint32(b[4:], h.SrcQP&PSNMask)
}

// Decode reads a DETH from b.
func (h *DETH) Decode(b []byte) error {
	if len(b) < DETHLen {
		return DropTruncated
	}
	h.QKey = binary.BigEndian.Uint32(b)
	h.SrcQP = binary.BigEndian.Uint32(b[4:]) & PSNMask
	return nil
}

// Syndrome is the AETH syndrome byte.
type Syndrome uint8

// AETH syndromes (IBTA 9.7.5.2.1): bits 6-5 select the kind.
const (
	// SyndromeACK with credit count 0x1F: "unlimited", as rxe sends.
	SyndromeACK Syndrome = 0x1F
	// SyndromeRNRNAK is OR-ed with the 5-bit RNR timer code.
	SyndromeRNRNAK Syndrome = 0x20
	// SyndromeNAKSeqErr: PSN sequence error.
	SyndromeNAKSeqErr Syndrome = 0x60
	// SyndromeNAKInvReq: invalid request (e.g. message too long).
	SyndromeNAKInvReq Syndrome = 0x61
	// SyndromeNAKRemAccErr: remote access error.
	SyndromeNAKRemAccErr Syndrome = 0x62
	// SyndromeNAKRemOpErr: remote operational error.
	SyndromeNAKRemOpErr Syndrome = 0x63
)

// SyndromeKind is the class of an AETH syndrome.
//
//go:generate go tool stringer -type=SyndromeKind -linecomment
type SyndromeKind uint8

// Syndrome kinds (bits 6-5).
const (
	KindACK      SyndromeKind = iota // ACK
	KindRNRNAK                       // RNR_NAK
	KindReserved                     // reserved
	KindNAK                          // NAK
)

// Kind returns the syndrome's class.
func (s Syndrome) Kind() SyndromeKind { return SyndromeKind(s >> 5 & 3) }

// Value returns the low 5 bits: credits, RNR timer code or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1F }

// RNRNAK returns the RNR NAK syndrome carrying timer code t.
func RNRNAK(t uint8) Syndrome { return SyndromeRNRNAK | Syndrome(t&0x1F) }

// AETH is the ACK extended transport header.
type AETH struct {
	Syndrome Syndrome
	MSN      uint32 // 24 bits
}

// Encode writes the AETH into b[:AETHLen].
func (h *AETH) Encode(b []byte) {
	_ = b[AETHLen-1]
	binary.BigEndian.PutUint32(b, uint32(h.Syndrome)<<24|h.MSN&PSNMask)
}

// Decode reads an AETH from b.
func (h *AETH) Decode(b []byte) error {
	if len(b) < AETHLen {
		return DropTruncated
	}
	w := binary.BigEndian.Uint32(b)
	h.Syndrome = Syndrome(w >> 24)
	h.MSN = w & PSNMask
	return nil
}

// PadCount returns the pad bytes that round a payload of n bytes up to a
// multiple of 4.
func PadCount(n int) uint8 { return uint8(-n & 3) }
