package cm

import (
	"encoding/binary"
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// Path is one path of a REQ (primary or alternate), IBTA table 106 bytes
// 52-95 / 96-139.
type Path struct {
	LocalLID        uint16
	RemoteLID       uint16
	LocalGID        hca.GID
	RemoteGID       hca.GID
	FlowLabel       uint32 // 20 bits
	PacketRate      uint8  // 6 bits
	TrafficClass    uint8
	HopLimit        uint8
	SL              uint8 // 4 bits
	SubnetLocal     bool
	LocalACKTimeout uint8 // 5 bits
}

const pathSize = 44

func (p *Path) put(b []byte) {
	binary.BigEndian.PutUint16(b[0:], p.LocalLID)
	binary.BigEndian.PutUint16(b[2:], p.RemoteLID)
	copy(b[4:20], p.LocalGID[:])
	copy(b[20:36], p.RemoteGID[:])
	// Flow label: bits 31..12; 6 reserved bits; packet rate: bits 5..0.
	binary.BigEndian.PutUint32(b[36:], (p.FlowLabel&0xFFFFF)<<12|uint32(p.PacketRate&0x3F))
	b[40] = p.TrafficClass
	b[41] = p.HopLimit
	b[42] = (p.SL&0xF)<<4 | b2u(p.SubnetLocal)<<3
	b[43] = (p.LocalACKTimeout & 0x1F) << 3
}

func (p *Path) parse(b []byte) {
	p.LocalLID = binary.BigEndian.Uint16(b[0:])
	p.RemoteLID = binary.BigEndian.Uint16(b[2:])
	copy(p.LocalGID[:], b[4:20])
	copy(p.RemoteGID[:], b[20:36])
	w := binary.BigEndian.Uint32(b[36:])
	p.FlowLabel = w >> 12
	p.PacketRate = uint8(w & 0x3F)
	p.TrafficClass = b[40]
	p.HopLimit = b[41]
	p.SL = b[42] >> 4
	p.SubnetLocal = b[42]&0x08 != 0
	p.LocalACKTimeout = b[43] >> 3
}

// Transport service types of a REQ.
const (
	TransportRC = 0
	TransportUC = 1
	TransportRD = 2
)

// REQ is ConnectRequest (IBTA 12.6.5, table 106). Reserved bits are
// written as zero and ignored on receive.
type REQ struct {
	TransactionID           uint64
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                hca.QPN // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits, 4.096 us * 2^t
	TransportServiceType    uint8  // 2 bits
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    hca.PKey
	PathMTU                 hca.MTU // 4-bit IBTA enum on the wire
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary                 Path
	Alternate               Path
	PrivateData             [REQPrivateDataSize]byte
}

// Type implements Message.
func (*REQ) Type() MsgType { return MsgREQ }

// TID implements Message.
func (m *REQ) TID() uint64 { return m.TransactionID }

// Marshal implements Message.
func (m *REQ) Marshal(b []byte) error {
	d, err := startMAD(b, MsgREQ, m.TransactionID)
	if err != nil {
		return err
	}
	mtu := m.PathMTU.Enum()
	if mtu == 0 {
		return fmt.Errorf("marshal REQ: path MTU %d: %w", m.PathMTU, ErrInconsistentField)
	}
	if m.TransportServiceType > 3 {
		return fmt.Errorf("marshal REQ: transport type %d: %w", m.TransportServiceType, ErrInconsistentField)
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint64(d[8:], m.ServiceID)
	binary.BigEndian.PutUint64(d[16:], m.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], m.LocalQKey)
	put24(d[32:], uint32(m.LocalQPN))
	d[35] = m.ResponderResources
	put24(d[36:], m.LocalEECN)
	d[39] = m.InitiatorDepth
	put24(d[40:], m.RemoteEECN)
	d[43] = (m.RemoteCMResponseTimeout&0x1F)<<3 | (m.TransportServiceType&3)<<1 | b2u(m.EndToEndFlowControl)
	put24(d[44:], m.StartingPSN)
	d[47] = (m.LocalCMResponseTimeout&0x1F)<<3 | m.RetryCount&7
	binary.BigEndian.PutUint16(d[48:], uint16(m.PKey))
	d[50] = mtu<<4 | b2u(m.RDCExists)<<3 | m.RNRRetryCount&7
	d[51] = (m.MaxCMRetries&0xF)<<4 | b2u(m.SRQ)<<3 | m.ExtendedTransportType&7
	m.Primary.put(d[52:])
	m.Alternate.put(d[52+pathSize:])
	copy(d[140:], m.PrivateData[:])
	return nil
}

// Unmarshal implements Message.
func (m *REQ) Unmarshal(b []byte) error {
	h, d, err := beginUnmarshal(b, MsgREQ)
	if err != nil {
		return err
	}
	mtu := hca.MTUFromEnum(d[50] >> 4)
	if mtu == 0 {
		return fmt.Errorf("decode REQ: path MTU code %d: %w", d[50]>>4, ErrInconsistentField)
	}
	if tt := (d[43] >> 1) & 3; tt == 3 {
		return fmt.Errorf("decode REQ: reserved transport type 3: %w", ErrInconsistentField)
	}
	*m = REQ{
		TransactionID:           h.TransactionID,
		LocalCommID:             binary.BigEndian.Uint32(d[0:]),
		ServiceID:               binary.BigEndian.Uint64(d[8:]),
		LocalCAGUID:             binary.BigEndian.Uint64(d[16:]),
		LocalQKey:               binary.BigEndian.Uint32(d[28:]),
		LocalQPN:                hca.QPN(get24(d[32:])),
		ResponderResources:      d[35],
		LocalEECN:               get24(d[36:]),
		InitiatorDepth:          d[39],
		RemoteEECN:              get24(d[40:]),
		RemoteCMResponseTimeout: d[43] >> 3,
		TransportServiceType:    (d[43] >> 1) & 3,
		EndToEndFlowControl:     d[43]&1 != 0,
		StartingPSN:             get24(d[44:]),
		LocalCMResponseTimeout:  d[47] >> 3,
		RetryCount:              d[47] & 7,
		PKey:                    hca.PKey(binary.BigEndian.Uint16(d[48:])),
		PathMTU:                 mtu,
		RDCExists:               d[50]&0x08 != 0,
		RNRRetryCount:           d[50] & 7,
		MaxCMRetries:            d[51] >> 4,
		SRQ:                     d[51]&0x08 != 0,
		ExtendedTransportType:   d[51] & 7,
	}
	m.Primary.parse(d[52:])
	m.Alternate.parse(d[52+pathSize:])
	copy(m.PrivateData[:], d[140:])
	return nil
}
