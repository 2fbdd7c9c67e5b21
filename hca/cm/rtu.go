package cm

import "encoding/binary"

// RTU is ReadyToUse (IBTA 12.6.9, table 111).
type RTU struct {
	TransactionID uint64
	LocalCommID   uint32
	RemoteCommID  uint32
	PrivateData   [RTUPrivateDataSize]byte
}

// Type implements Message.
func (*RTU) Type() MsgType { return MsgRTU }

// TID implements Message.
func (m *RTU) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *RTU) Marshal(b []byte) error {
	d, err := startMAD(b, MsgRTU, m.TransactionID)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	copy(d[8:], m.PrivateData[:])
	return nil
}

// Unmarshal implements Message.
func (m *RTU) Unmarshal(b []byte) error {
	h, d, err := beginUnmarshal(b, MsgRTU)
	if err != nil {
		return err
	}
	*m = RTU{
		TransactionID: h.TransactionID,
		LocalCommID:   binary.BigEndian.Uint32(d[0:]),
		RemoteCommID:  binary.BigEndian.Uint32(d[4:]),
	}
	copy(m.PrivateData[:], d[8:])
	return nil
}
