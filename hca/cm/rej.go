package cm

import (
	"encoding/binary"
	"fmt"
)

// RejectReason is a REJ reason code (IBTA table 109, Linux enum
// ib_cm_rej_reason).
//
//go:generate go tool stringer -type=RejectReason -linecomment
type RejectReason uint16

// Reject reasons.
const (
	RejectNoQP                  RejectReason = 1  // NO_QP
	RejectNoEEC                 RejectReason = 2  // NO_EEC
	RejectNoResources           RejectReason = 3  // NO_RESOURCES
	RejectTimeout               RejectReason = 4  // TIMEOUT
	RejectUnsupported           RejectReason = 5  // UNSUPPORTED
	RejectInvalidCommID         RejectReason = 6  // INVALID_COMM_ID
	RejectInvalidCommInstance   RejectReason = 7  // INVALID_COMM_INSTANCE
	RejectInvalidServiceID      RejectReason = 8  // INVALID_SERVICE_ID
	RejectInvalidTransportType  RejectReason = 9  // INVALID_TRANSPORT_TYPE
	RejectStaleConn             RejectReason = 10 // STALE_CONN
	RejectRDCNotExist           RejectReason = 11 // RDC_NOT_EXIST
	RejectInvalidGID            RejectReason = 12 // INVALID_GID
	RejectInvalidLID            RejectReason = 13 // INVALID_LID
	RejectInvalidSL             RejectReason = 14 // INVALID_SL
	RejectInvalidTrafficClass   RejectReason = 15 // INVALID_TRAFFIC_CLASS
	RejectInvalidHopLimit       RejectReason = 16 // INVALID_HOP_LIMIT
	RejectInvalidPacketRate     RejectReason = 17 // INVALID_PACKET_RATE
	RejectPortCMRedirect        RejectReason = 24 // PORT_CM_REDIRECT
	RejectPortRedirect          RejectReason = 25 // PORT_REDIRECT
	RejectInvalidMTU            RejectReason = 26 // INVALID_MTU
	RejectInsufficientRespRes   RejectReason = 27 // INSUFFICIENT_RESP_RESOURCES
	RejectConsumerDefined       RejectReason = 28 // CONSUMER_DEFINED
	RejectInvalidRNRRetry       RejectReason = 29 // INVALID_RNR_RETRY
	RejectDuplicateLocalCommID  RejectReason = 30 // DUPLICATE_LOCAL_COMM_ID
	RejectInvalidClassVersion   RejectReason = 31 // INVALID_CLASS_VERSION
	RejectInvalidFlowLabel      RejectReason = 32 // INVALID_FLOW_LABEL
	RejectInvalidAltFlowLabel   RejectReason = 33 // INVALID_ALT_FLOW_LABEL
	RejectVendorOptionNotSupptd RejectReason = 35 // VENDOR_OPTION_NOT_SUPPORTED
)

// rejectReasons lists every reason the codec names, for counters that
// show each one, zero included.
var rejectReasons = [...]RejectReason{RejectNoQP, RejectNoEEC, RejectNoResources, RejectTimeout, RejectUnsupported, RejectInvalidCommID, RejectInvalidCommInstance, RejectInvalidServiceID, RejectInvalidTransportType, RejectStaleConn, RejectRDCNotExist, RejectInvalidGID, RejectInvalidLID, RejectInvalidSL, RejectInvalidTrafficClass, RejectInvalidHopLimit, RejectInvalidPacketRate, RejectPortCMRedirect, RejectPortRedirect, RejectInvalidMTU, RejectInsufficientRespRes, RejectConsumerDefined, RejectInvalidRNRRetry, RejectDuplicateLocalCommID, RejectInvalidClassVersion, RejectInvalidFlowLabel, RejectInvalidAltFlowLabel, RejectVendorOptionNotSupptd}

// MsgResponse says which message a REJ or MRA answers (IBTA table 107).
//
//go:generate go tool stringer -type=MsgResponse -linecomment
type MsgResponse uint8

// Values of MessageRejected / MessageMRAed.
const (
	RespondsToREQ   MsgResponse = 0 // REQ
	RespondsToREP   MsgResponse = 1 // REP
	RespondsToOther MsgResponse = 2 // other
)

// REJ is Reject (IBTA 12.6.7, table 108).
type REJ struct {
	TransactionID    uint64
	LocalCommID      uint32
	RemoteCommID     uint32
	MessageRejected  MsgResponse // 2 bits
	RejectInfoLength uint8       // 7 bits, bytes of ARI used
	Reason           RejectReason
	ARI              [REJARISize]byte
	PrivateData      [REJPrivateDataSize]byte
}

// Type implements Message.
func (*REJ) Type() MsgType { return MsgREJ }

// TID implements Message.
func (m *REJ) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *REJ) Marshal(b []byte) error {
	if m.MessageRejected > RespondsToOther || m.RejectInfoLength > REJARISize {
		return fmt.Errorf("marshal REJ: rejected %d, ARI length %d: %w", m.MessageRejected, m.RejectInfoLength, ErrInconsistentField)
	}
	d, err := startMAD(b, MsgREJ, m.TransactionID)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8] = uint8(m.MessageRejected) << 6
	d[9] = m.RejectInfoLength << 1
	binary.BigEndian.PutUint16(d[10:], uint16(m.Reason))
	copy(d[12:], m.ARI[:])
	copy(d[84:], m.PrivateData[:])
	return nil
}

// Unmarshal implements Message.
func (m *REJ) Unmarshal(b []byte) error {
	h, d, err := beginUnmarshal(b, MsgREJ)
	if err != nil {
		return err
	}
	rejected, infoLen := MsgResponse(d[8]>>6), d[9]>>1
	if rejected > RespondsToOther {
		return fmt.Errorf("decode REJ: message rejected %d: %w", rejected, ErrInconsistentField)
	}
	if infoLen > REJARISize {
		return fmt.Errorf("decode REJ: ARI length %d: %w", infoLen, ErrInconsistentField)
	}
	*m = REJ{
		TransactionID:    h.TransactionID,
		LocalCommID:      binary.BigEndian.Uint32(d[0:]),
		RemoteCommID:     binary.BigEndian.Uint32(d[4:]),
		MessageRejected:  rejected,
		RejectInfoLength: infoLen,
		Reason:           RejectReason(binary.BigEndian.Uint16(d[10:])),
	}
	copy(m.ARI[:], d[12:84])
	copy(m.PrivateData[:], d[84:])
	return nil
}
