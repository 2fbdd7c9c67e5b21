package cm

import (
	"encoding/binary"
	"fmt"
)

// RejectReason is a REJ reason code (IBTA table 109, Linux enum
// ib_cm_rej_reason).
type RejectReason uint16

// Reject reasons.
const (
	RejectNoQP                  RejectReason = 1
	RejectNoEEC                 RejectReason = 2
	RejectNoResources           RejectReason = 3
	RejectTimeout               RejectReason = 4
	RejectUnsupported           RejectReason = 5
	RejectInvalidCommID         RejectReason = 6
	RejectInvalidCommInstance   RejectReason = 7
	RejectInvalidServiceID      RejectReason = 8
	RejectInvalidTransportType  RejectReason = 9
	RejectStaleConn             RejectReason = 10
	RejectRDCNotExist           RejectReason = 11
	RejectInvalidGID            RejectReason = 12
	RejectInvalidLID            RejectReason = 13
	RejectInvalidSL             RejectReason = 14
	RejectInvalidTrafficClass   RejectReason = 15
	RejectInvalidHopLimit       RejectReason = 16
	RejectInvalidPacketRate     RejectReason = 17
	RejectPortCMRedirect        RejectReason = 24
	RejectPortRedirect          RejectReason = 25
	RejectInvalidMTU            RejectReason = 26
	RejectInsufficientRespRes   RejectReason = 27
	RejectConsumerDefined       RejectReason = 28
	RejectInvalidRNRRetry       RejectReason = 29
	RejectDuplicateLocalCommID  RejectReason = 30
	RejectInvalidClassVersion   RejectReason = 31
	RejectInvalidFlowLabel      RejectReason = 32
	RejectInvalidAltFlowLabel   RejectReason = 33
	RejectVendorOptionNotSupptd RejectReason = 35
)

var rejectNames = map[RejectReason]string{
	RejectNoQP:                  "NO_QP",
	RejectNoEEC:                 "NO_EEC",
	RejectNoResources:           "NO_RESOURCES",
	RejectTimeout:               "TIMEOUT",
	RejectUnsupported:           "UNSUPPORTED",
	RejectInvalidCommID:         "INVALID_COMM_ID",
	RejectInvalidCommInstance:   "INVALID_COMM_INSTANCE",
	RejectInvalidServiceID:      "INVALID_SERVICE_ID",
	RejectInvalidTransportType:  "INVALID_TRANSPORT_TYPE",
	RejectStaleConn:             "STALE_CONN",
	RejectRDCNotExist:           "RDC_NOT_EXIST",
	RejectInvalidGID:            "INVALID_GID",
	RejectInvalidLID:            "INVALID_LID",
	RejectInvalidSL:             "INVALID_SL",
	RejectInvalidTrafficClass:   "INVALID_TRAFFIC_CLASS",
	RejectInvalidHopLimit:       "INVALID_HOP_LIMIT",
	RejectInvalidPacketRate:     "INVALID_PACKET_RATE",
	RejectPortCMRedirect:        "PORT_CM_REDIRECT",
	RejectPortRedirect:          "PORT_REDIRECT",
	RejectInvalidMTU:            "INVALID_MTU",
	RejectInsufficientRespRes:   "INSUFFICIENT_RESP_RESOURCES",
	RejectConsumerDefined:       "CONSUMER_DEFINED",
	RejectInvalidRNRRetry:       "INVALID_RNR_RETRY",
	RejectDuplicateLocalCommID:  "DUPLICATE_LOCAL_COMM_ID",
	RejectInvalidClassVersion:   "INVALID_CLASS_VERSION",
	RejectInvalidFlowLabel:      "INVALID_FLOW_LABEL",
	RejectInvalidAltFlowLabel:   "INVALID_ALT_FLOW_LABEL",
	RejectVendorOptionNotSupptd: "VENDOR_OPTION_NOT_SUPPORTED",
}

func (r RejectReason) String() string {
	if s, ok := rejectNames[r]; ok {
		return s
	}
	return fmt.Sprintf("RejectReason(%d)", uint16(r))
}

// MsgResponse says which message a REJ or MRA answers (IBTA table 107).
type MsgResponse uint8

// Values of MessageRejected / MessageMRAed.
const (
	RespondsToREQ   MsgResponse = 0
	RespondsToREP   MsgResponse = 1
	RespondsToOther MsgResponse = 2
)

func (r MsgResponse) String() string {
	switch r {
	case RespondsToREQ:
		return "REQ"
	case RespondsToREP:
		return "REP"
	case RespondsToOther:
		return "other"
	}
	return fmt.Sprintf("MsgResponse(%d)", uint8(r))
}

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
