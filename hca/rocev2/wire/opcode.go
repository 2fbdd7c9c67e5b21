package wire

// Opcode is the BTH OpCode: bits 7-5 the transport, 4-0 the operation.
//
//go:generate go tool stringer -type=Opcode -linecomment
type Opcode uint8

// The opcodes IPoIB needs (IBTA Vol 1 table 35).
const (
	OpRCSendFirst  Opcode = 0x00 // RC_SEND_FIRST
	OpRCSendMiddle Opcode = 0x01 // RC_SEND_MIDDLE
	OpRCSendLast   Opcode = 0x02 // RC_SEND_LAST
	OpRCSendOnly   Opcode = 0x04 // RC_SEND_ONLY
	OpRCAck        Opcode = 0x11 // RC_ACKNOWLEDGE
	OpUDSendOnly   Opcode = 0x64 // UD_SEND_ONLY
	// OpCNP is the RoCEv2 congestion notification packet; decoded so that
	// the ConnectX golden vector parses, never sent.
	OpCNP Opcode = 0x81 // CNP
)

// Supported reports whether the codec knows the opcode's header layout.
func (o Opcode) Supported() bool {
	switch o {
	case OpRCSendFirst, OpRCSendMiddle, OpRCSendLast, OpRCSendOnly, OpRCAck, OpUDSendOnly, OpCNP:
		return true
	}
	return false
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
