package wire

import "fmt"

// Opcode is the BTH OpCode: bits 7-5 the transport, 4-0 the operation.
type Opcode uint8

// The opcodes IPoIB needs (IBTA Vol 1 table 35).
const (
	OpRCSendFirst  Opcode = 0x00
	OpRCSendMiddle Opcode = 0x01
	OpRCSendLast   Opcode = 0x02
	OpRCSendOnly   Opcode = 0x04
	OpRCAck        Opcode = 0x11
	OpUDSendOnly   Opcode = 0x64
	// OpCNP is the RoCEv2 congestion notification packet; decoded so that
	// the ConnectX golden vector parses, never sent.
	OpCNP Opcode = 0x81
)

var opcodeNames = map[Opcode]string{
	OpRCSendFirst:  "RC_SEND_FIRST",
	OpRCSendMiddle: "RC_SEND_MIDDLE",
	OpRCSendLast:   "RC_SEND_LAST",
	OpRCSendOnly:   "RC_SEND_ONLY",
	OpRCAck:        "RC_ACKNOWLEDGE",
	OpUDSendOnly:   "UD_SEND_ONLY",
	OpCNP:          "CNP",
}

func (o Opcode) String() string {
	if s, ok := opcodeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("Opcode(%#02x)", uint8(o))
}

// Supported reports whether the codec knows the opcode's header layout.
func (o Opcode) Supported() bool {
	_, ok := opcodeNames[o]
	return ok
}

// IsRCSend reports whether o is one of the four RC SEND opcodes.
func (o Opcode) IsRCSend() bool {
	switch o {
	case OpRCSendFirst, OpRCSendMiddle, OpRCSendLast, OpRCSendOnly:
		return true
	}
	return false
}

// StartsMessage reports whether o is the first packet of a message.
func (o Opcode) StartsMessage() bool { return o == OpRCSendFirst || o == OpRCSendOnly }

// EndsMessage reports whether o is the last packet of a message.
func (o Opcode) EndsMessage() bool { return o == OpRCSendLast || o == OpRCSendOnly }

// extLen is the length of the extended headers that follow the BTH.
func (o Opcode) extLen() int {
	switch o {
	case OpUDSendOnly:
		return DETHLen
	case OpRCAck:
		return AETHLen
	case OpCNP:
		return cnpReservedLen
	}
	return 0
}
