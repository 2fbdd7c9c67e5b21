package cm

import (
	"encoding/binary"

	"github.com/ipoibcm/ipoib/hca"
)

// REP is ConnectReply (IBTA 12.6.8, table 110).
type REP struct {
	TransactionID       uint64
	LocalCommID         uint32
	RemoteCommID        uint32
	LocalQKey           uint32
	LocalQPN            hca.QPN // 24 bits
	LocalEECN           uint32  // 24 bits
	StartingPSN         uint32  // 24 bits: the PSN the sender's RQ expects
	ResponderResources  uint8
	InitiatorDepth      uint8
	TargetACKDelay      uint8 // 5 bits
	FailoverAccepted    uint8 // 2 bits
	EndToEndFlowControl bool
	RNRRetryCount       uint8 // 3 bits
	SRQ                 bool
	LocalCAGUID         uint64
	PrivateData         [REPPrivateDataSize]byte
}

// Type implements Message.
func (*REP) Type() MsgType { return MsgREP }

// TID implements Message.
func (m *REP) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *REP) Marshal(b []byte) error {
	d, err := startMAD(b, MsgREP, m.TransactionID)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], m.LocalQKey)
	put24(d[12:], uint32(m.LocalQPN))
	put24(d[16:], m.LocalEECN)
	put24(d[20:], m.StartingPSN)
	d[24] = m.ResponderResources
	d[25] = m.InitiatorDepth
	d[26] = (m.TargetACKDelay&0x1F)<<3 | (m.FailoverAccepted&3)<<1 | b2u(m.EndToEndFlowControl)
	d[27] = (m.RNRRetryCount&7)<<5 | b2u(m.SRQ)<<4
	binary.BigEndian.PutUint64(d[28:], m.LocalCAGUID)
	copy(d[36:], m.PrivateData[:])
	return nil
}

// Unmarshal implements Message.
func (m *REP) Unmarshal(b []byte) error {
	h, d, err := beginUnmarshal(b, MsgREP)
	if err != nil {
		return err
	}
	*m = REP{
		TransactionID:       h.TransactionID,
		LocalCommID:         binary.BigEndian.Uint32(d[0:]),
		RemoteCommID:        binary.BigEndian.Uint32(d[4:]),
		LocalQKey:           binary.BigEndian.Uint32(d[8:]),
		LocalQPN:            hca.QPN(get24(d[12:])),
		LocalEECN:           get24(d[16:]),
		StartingPSN:         get24(d[20:]),
		ResponderResources:  d[24],
		InitiatorDepth:      d[25],
		TargetACKDelay:      d[26] >> 3,
		FailoverAccepted:    (d[26] >> 1) & 3,
		EndToEndFlowControl: d[26]&1 != 0,
		RNRRetryCount:       d[27] >> 5,
		SRQ:                 d[27]&0x10 != 0,
		LocalCAGUID:         binary.BigEndian.Uint64(d[28:]),
	}
	copy(m.PrivateData[:], d[36:])
	return nil
}
