package cm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MAD layout constants (IBTA 13.4.3, 12.6).
const (
	// MADSize is the size of every CM MAD on the wire.
	MADSize = 256
	// MADHeaderSize is the common MAD header in front of the CM message.
	MADHeaderSize = 24
	// MADDataSize is the room for a CM message after the header.
	MADDataSize = MADSize - MADHeaderSize

	BaseVersion     = 1
	MgmtClassCM     = 0x07
	ClassVersionCM  = 2
	MethodSend      = 0x03
	methodRespBit   = 0x80
	madAttrIDOffset = 16
)

// Private data sizes of each message (IBTA table 105 ff.).
const (
	REQPrivateDataSize  = 92
	MRAPrivateDataSize  = 222
	REJPrivateDataSize  = 148
	REPPrivateDataSize  = 196
	RTUPrivateDataSize  = 224
	DREQPrivateDataSize = 220
	DREPPrivateDataSize = 224
	// REJARISize is the largest Additional Rejection Information.
	REJARISize = 72
)

// Decoding errors. DecodeMAD wraps exactly one of them, so a receiver can
// count drops per reason with errors.Is.
var (
	ErrShortMAD          = errors.New("MAD shorter than 256 bytes")
	ErrLongMAD           = errors.New("MAD longer than 256 bytes")
	ErrBaseVersion       = errors.New("unsupported MAD base version")
	ErrMgmtClass         = errors.New("not a CM MAD (management class)")
	ErrClassVersion      = errors.New("unsupported CM class version")
	ErrMethod            = errors.New("unsupported CM method")
	ErrAttribute         = errors.New("unknown CM attribute")
	ErrInconsistentField = errors.New("inconsistent CM field")
	ErrBufferTooSmall    = errors.New("buffer shorter than a MAD")
	ErrPrivateDataSize   = errors.New("private data too long")
)

// MsgType names a CM message by its attribute.
type MsgType uint16

// CM attribute IDs (IBTA table 97).
const (
	MsgREQ  MsgType = 0x0010
	MsgMRA  MsgType = 0x0011
	MsgREJ  MsgType = 0x0012
	MsgREP  MsgType = 0x0013
	MsgRTU  MsgType = 0x0014
	MsgDREQ MsgType = 0x0015
	MsgDREP MsgType = 0x0016
)

// msgTypes lists the message types the codec knows, for counters.
var msgTypes = [...]MsgType{MsgREQ, MsgMRA, MsgREJ, MsgREP, MsgRTU, MsgDREQ, MsgDREP}

// String is written by hand, unlike the other enums' generated ones: an
// unknown attribute ID prints in hex, the way IBTA tables and tshark show
// attribute IDs.
func (t MsgType) String() string {
	switch t {
	case MsgREQ:
		return "REQ"
	case MsgMRA:
		return "MRA"
	case MsgREJ:
		return "REJ"
	case MsgREP:
		return "REP"
	case MsgRTU:
		return "RTU"
	case MsgDREQ:
		return "DREQ"
	case MsgDREP:
		return "DREP"
	}
	return fmt.Sprintf("MsgType(%#04x)", uint16(t))
}

// msgIndex maps a known type to 0..len(msgTypes)-1, -1 otherwise.
func msgIndex(t MsgType) int {
	if t >= MsgREQ && t <= MsgDREP {
		return int(t - MsgREQ)
	}
	return -1
}

// Message is one decoded CM message.
type Message interface {
	// Type is the message's attribute ID.
	Type() MsgType
	// TID is the transaction ID of the MAD carrying it.
	TID() uint64
	// Marshal writes the whole 256-byte MAD, header included, into b.
	Marshal(b []byte) error
	// Unmarshal parses a whole MAD (header included) into the message.
	Unmarshal(b []byte) error
}

// MADHeader is the common MAD header (IBTA 13.4.3).
type MADHeader struct {
	BaseVersion       uint8
	MgmtClass         uint8
	ClassVersion      uint8
	Method            uint8 // R bit included
	Status            uint16
	ClassSpecific     uint16
	TransactionID     uint64
	AttributeID       uint16
	AttributeModifier uint32
}

// PutMADHeader writes h into b[:24].
func PutMADHeader(b []byte, h MADHeader) {
	b[0] = h.BaseVersion
	b[1] = h.MgmtClass
	b[2] = h.ClassVersion
	b[3] = h.Method
	binary.BigEndian.PutUint16(b[4:], h.Status)
	binary.BigEndian.PutUint16(b[6:], h.ClassSpecific)
	binary.BigEndian.PutUint64(b[8:], h.TransactionID)
	binary.BigEndian.PutUint16(b[16:], h.AttributeID)
	b[18], b[19] = 0, 0
	binary.BigEndian.PutUint32(b[20:], h.AttributeModifier)
}

// ParseMADHeader reads the header of b, which must hold at least 24 bytes.
func ParseMADHeader(b []byte) (MADHeader, error) {
	if len(b) < MADHeaderSize {
		return MADHeader{}, fmt.Errorf("MAD header of %d bytes: %w", len(b), ErrShortMAD)
	}
	return MADHeader{
		BaseVersion:       b[0],
		MgmtClass:         b[1],
		ClassVersion:      b[2],
		Method:            b[3],
		Status:            binary.BigEndian.Uint16(b[4:]),
		ClassSpecific:     binary.BigEndian.Uint16(b[6:]),
		TransactionID:     binary.BigEndian.Uint64(b[8:]),
		AttributeID:       binary.BigEndian.Uint16(b[16:]),
		AttributeModifier: binary.BigEndian.Uint32(b[20:]),
	}, nil
}

// startMAD checks the buffer, clears it and writes a CM Send header; it
// returns the 232-byte message area.
func startMAD(b []byte, t MsgType, tid uint64) ([]byte, error) {
	if len(b) < MADSize {
		return nil, fmt.Errorf("marshal %s into %d bytes: %w", t, len(b), ErrBufferTooSmall)
	}
	b = b[:MADSize]
	clear(b)
	PutMADHeader(b, MADHeader{
		BaseVersion:   BaseVersion,
		MgmtClass:     MgmtClassCM,
		ClassVersion:  ClassVersionCM,
		Method:        MethodSend,
		TransactionID: tid,
		AttributeID:   uint16(t),
	})
	return b[MADHeaderSize:], nil
}

// checkMAD validates the length and the CM header of a whole MAD and
// returns the header.
func checkMAD(b []byte) (MADHeader, error) {
	switch {
	case len(b) < MADSize:
		return MADHeader{}, fmt.Errorf("MAD of %d bytes: %w", len(b), ErrShortMAD)
	case len(b) > MADSize:
		return MADHeader{}, fmt.Errorf("MAD of %d bytes: %w", len(b), ErrLongMAD)
	}
	h, _ := ParseMADHeader(b)
	switch {
	case h.BaseVersion != BaseVersion:
		return h, fmt.Errorf("base version %d: %w", h.BaseVersion, ErrBaseVersion)
	case h.MgmtClass != MgmtClassCM:
		return h, fmt.Errorf("class %#02x: %w", h.MgmtClass, ErrMgmtClass)
	case h.ClassVersion != ClassVersionCM:
		return h, fmt.Errorf("class version %d: %w", h.ClassVersion, ErrClassVersion)
	case h.Method != MethodSend:
		return h, fmt.Errorf("method %#02x: %w", h.Method, ErrMethod)
	}
	return h, nil
}

// beginUnmarshal validates b as a MAD carrying a message of type t and
// returns its header and the message area.
func beginUnmarshal(b []byte, t MsgType) (MADHeader, []byte, error) {
	h, err := checkMAD(b)
	if err != nil {
		return h, nil, fmt.Errorf("decode %s: %w", t, err)
	}
	if MsgType(h.AttributeID) != t {
		return h, nil, fmt.Errorf("decode %s: attribute %#04x: %w", t, h.AttributeID, ErrAttribute)
	}
	return h, b[MADHeaderSize:MADSize], nil
}

// DecodeMAD parses a whole CM MAD into a newly allocated message. It never
// panics; malformed input returns an error wrapping one of the Err* values.
func DecodeMAD(b []byte) (Message, error) {
	h, err := checkMAD(b)
	if err != nil {
		return nil, fmt.Errorf("decode CM MAD: %w", err)
	}
	var m Message
	switch MsgType(h.AttributeID) {
	case MsgREQ:
		m = new(REQ)
	case MsgMRA:
		m = new(MRA)
	case MsgREJ:
		m = new(REJ)
	case MsgREP:
		m = new(REP)
	case MsgRTU:
		m = new(RTU)
	case MsgDREQ:
		m = new(DREQ)
	case MsgDREP:
		m = new(DREP)
	default:
		return nil, fmt.Errorf("decode CM MAD: attribute %#04x: %w", h.AttributeID, ErrAttribute)
	}
	if err := m.Unmarshal(b); err != nil {
		return nil, err
	}
	return m, nil
}

// put24 and get24 handle the 24-bit big-endian fields (QPNs, PSNs, EECNs)
// that occupy the top three bytes of a 32-bit word.
func put24(b []byte, v uint32) {
	b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v)
}

func get24(b []byte) uint32 {
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}
