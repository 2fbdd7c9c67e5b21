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
	return marshalCommIDs(b, MsgRTU, m.TransactionID, m.LocalCommID, m.RemoteCommID, m.PrivateData[:])
}

// Unmarshal implements Message.
func (m *RTU) Unmarshal(b []byte) error {
	var pd [RTUPrivateDataSize]byte
	tid, local, remote, err := unmarshalCommIDs(b, MsgRTU, pd[:])
	if err != nil {
		return err
	}
	*m = RTU{TransactionID: tid, LocalCommID: local, RemoteCommID: remote, PrivateData: pd}
	return nil
}

// RTU and DREP share one layout (IBTA tables 111 and 113): the two
// communication IDs, then 224 bytes of private data.

func marshalCommIDs(b []byte, t MsgType, tid uint64, local, remote uint32, pd []byte) error {
	d, err := startMAD(b, t, tid)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], local)
	binary.BigEndian.PutUint32(d[4:], remote)
	copy(d[8:], pd)
	return nil
}

func unmarshalCommIDs(b []byte, t MsgType, pd []byte) (tid uint64, local, remote uint32, err error) {
	h, d, err := beginUnmarshal(b, t)
	if err != nil {
		return 0, 0, 0, err
	}
	copy(pd, d[8:])
	return h.TransactionID, binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:]), nil
}
