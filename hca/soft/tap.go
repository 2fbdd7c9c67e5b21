package soft

import "github.com/ipoibcm/ipoib/hca"

// Tap sees every message the fabric carries, as a wire would: what ipoib
// capture records. Message runs under the fabric lock, on whichever
// goroutine posted or retried the send: it must be quick, must not block
// or call into the fabric, and must copy m.Data to keep it.
type Tap interface {
	Message(m *Message)
}

// MessageKind says what a tapped message is.
type MessageKind uint8

// Message kinds.
const (
	// MessageUD is a UD send as it leaves the sender, once per send even
	// to a multicast group (DstQPN hca.QPNMulticast, DstGID the MGID).
	MessageUD MessageKind = iota
	// MessageRC is an RC send message placed in the responder's buffer.
	MessageRC
	// MessageRNRNak is the responder's RNR NAK of the sender's head
	// message (Src is the responder).
	MessageRNRNak
)

// Message is one tapped message. Data is valid only during Tap.Message.
type Message struct {
	Kind           MessageKind
	SrcDev, DstDev string // device names; DstDev "" for a group or an unknown GID
	SrcGID, DstGID hca.GID
	SrcQPN, DstQPN hca.QPN
	QKey           hca.QKey // UD: the Q_Key the datagram carries
	PKey           hca.PKey
	MTU            hca.MTU // the path MTU RC messages are cut into packets by
	Data           []byte
}

// tapUD reports a UD send (under f.mu).
func (f *Fabric) tapUD(s *qp, wr *hca.SendWR, dgid hca.GID, pkey hca.PKey) {
	m := Message{Kind: MessageUD, SrcDev: s.dev.name, SrcGID: s.dev.gid, DstGID: dgid,
		SrcQPN: s.qpn, DstQPN: wr.RemoteQPN & hca.QPNMask, QKey: wr.RemoteQKey, PKey: pkey, MTU: f.cfg.MTU, Data: wr.Data}
	if d := f.devices[dgid]; d != nil {
		m.DstDev = d.name
	}
	f.cfg.Tap.Message(&m)
}

// tapRC reports an RC message from s to r, or r's RNR NAK of it (under
// f.mu).
func (f *Fabric) tapRC(kind MessageKind, s, r *qp, data []byte) {
	m := Message{Kind: kind, SrcDev: s.dev.name, DstDev: r.dev.name, SrcGID: s.dev.gid, DstGID: r.dev.gid,
		SrcQPN: s.qpn, DstQPN: r.qpn, PKey: s.pkey(), MTU: f.cfg.MTU, Data: data}
	if kind == MessageRNRNak {
		m.SrcDev, m.DstDev, m.SrcGID, m.DstGID, m.SrcQPN, m.DstQPN = r.dev.name, s.dev.name, r.dev.gid, s.dev.gid, r.qpn, s.qpn
		m.Data = nil
	}
	f.cfg.Tap.Message(&m)
}
