package cm

import (
	"encoding/binary"
	"fmt"
)

// MRA is MessageReceiptAcknowledgement (IBTA 12.6.6, table 107): "I have
// your message, give me ServiceTimeout longer".
type MRA struct {
	TransactionID  uint64
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   MsgResponse // 2 bits
	ServiceTimeout uint8       // 5 bits, 4.096 us * 2^t
	PrivateData    [MRAPrivateDataSize]byte
}

// Type implements Message.
func (*MRA) Type() MsgType { return MsgMRA }

// TID implements Message.
func (m *MRA) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *MRA) Marshal(b []byte) error {
	if m.MessageMRAed > RespondsToOther {
		return fmt.Errorf("marshal MRA: message MRAed %d: %w", m.MessageMRAed, ErrInconsistentField)
	}
	d, err := startMAD(b, MsgMRA, m.TransactionID)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8] = uint8(m.MessageMRAed) << 6
	d[9] = (m.ServiceTimeout & 0x1F) << 3
	copy(d[10:], m.PrivateData[:])
	return nil
}

// Unmarshal implements Message.
func (m *MRA) Unmarshal(b []byte) error {
	h, d, err := beginUnmarshal(b, MsgMRA)
	if err != nil {
		return err
	}
	mraed := MsgResponse(d[8] >> 6)
	if mraed > RespondsToOther {
		return fmt.Errorf("decode MRA: message MRAed %d: %w", mraed, ErrInconsistentField)
	}
	*m = MRA{
		TransactionID:  h.TransactionID,
		LocalCommID:    binary.BigEndian.Uint32(d[0:]),
		RemoteCommID:   binary.BigEndian.Uint32(d[4:]),
		MessageMRAed:   mraed,
		ServiceTimeout: d[9] >> 3,
	}
	copy(m.PrivateData[:], d[10:])
	return nil
}
