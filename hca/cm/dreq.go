package cm

import (
	"encoding/binary"

	"github.com/ipoibcm/ipoib/hca"
)

// DREQ is DisconnectRequest (IBTA 12.6.10, table 112).
type DREQ struct {
	TransactionID uint64
	LocalCommID   uint32
	RemoteCommID  uint32
	RemoteQPN     hca.QPN // 24 bits: the receiver's QPN (or EECN)
	PrivateData   [DREQPrivateDataSize]byte
}

// Type implements Message.
func (*DREQ) Type() MsgType { return MsgDREQ }

// TID implements Message.
func (m *DREQ) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *DREQ) Marshal(b []byte) error {
	d, err := startMAD(b, MsgDREQ, m.TransactionID)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	put24(d[8:], uint32(m.RemoteQPN))
	copy(d[12:], m.PrivateData[:])
	return nil
}

// Unmarshal implements Message.
func (m *DREQ) Unmarshal(b []byte) error {
	h, d, err := beginUnmarshal(b, MsgDREQ)
	if err != nil {
		return err
	}
	*m = DREQ{
		TransactionID: h.TransactionID,
		LocalCommID:   binary.BigEndian.Uint32(d[0:]),
		RemoteCommID:  binary.BigEndian.Uint32(d[4:]),
		RemoteQPN:     hca.QPN(get24(d[8:])),
	}
	copy(m.PrivateData[:], d[12:])
	return nil
}

// DREP is DisconnectReply (IBTA 12.6.11, table 113).
type DREP struct {
	TransactionID uint64
	LocalCommID   uint32
	RemoteCommID  uint32
	PrivateData   [DREPPrivateDataSize]byte
}

// Type implements Message.
func (*DREP) Type() MsgType { return MsgDREP }

// TID implements Message.
func (m *DREP) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *DREP) Marshal(b []byte) error {
	return marshalCommIDs(b, MsgDREP, m.TransactionID, m.LocalCommID, m.RemoteCommID, m.PrivateData[:])
}

// Unmarshal implements Message.
func (m *DREP) Unmarshal(b []byte) error {
	var pd [DREPPrivateDataSize]byte
	tid, local, remote, err := unmarshalCommIDs(b, MsgDREP, pd[:])
	if err != nil {
		return err
	}
	*m = DREP{TransactionID: tid, LocalCommID: local, RemoteCommID: remote, PrivateData: pd}
	return nil
}
