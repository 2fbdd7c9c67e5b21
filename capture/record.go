package capture

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unsafe"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// Kind selects which traffic a Filter passes.
type Kind uint8

// Kinds.
const (
	KindAll  Kind = iota
	KindCM        // CM MADs (UD to or from QP 1)
	KindData      // everything else: IPoIB over UD and RC, ACKs, RNR NAKs
)

// ParseKind reads "all", "cm" or "data".
func ParseKind(s string) (Kind, error) {
	switch s {
	case "", "all":
		return KindAll, nil
	case "cm":
		return KindCM, nil
	case "data":
		return KindData, nil
	}
	return 0, fmt.Errorf("capture kind %q: want all, cm or data", s)
}

func (k Kind) String() string {
	switch k {
	case KindCM:
		return "cm"
	case KindData:
		return "data"
	}
	return "all"
}

// Filter chooses what is recorded. The zero Filter records everything.
type Filter struct {
	// Host records only messages from or to this device (the soft
	// fabric's device names are the host names), and only its events.
	Host string
	// QPN records only messages from or to this QP (and events of it).
	QPN  hca.QPN
	Kind Kind
}

func (f Filter) String() string {
	var parts []string
	if f.Host != "" {
		parts = append(parts, "host "+f.Host)
	}
	if f.QPN != 0 {
		parts = append(parts, fmt.Sprintf("qpn 0x%06x", uint32(f.QPN)))
	}
	parts = append(parts, "kind "+f.Kind.String())
	return strings.Join(parts, ", ")
}

// gsiQPN is QP 1, which carries CM MADs.
const gsiQPN hca.QPN = 1

func (f *Filter) passMessage(m *soft.Message) bool {
	if f.Host != "" && m.SrcDev != f.Host && m.DstDev != f.Host {
		return false
	}
	if f.QPN != 0 && m.SrcQPN != f.QPN && m.DstQPN != f.QPN {
		return false
	}
	return f.passKind(m.Kind == soft.MessageUD && (m.SrcQPN == gsiQPN || m.DstQPN == gsiQPN))
}

// passKind applies Kind to a message that is a CM MAD or not.
func (f *Filter) passKind(cm bool) bool {
	switch f.Kind {
	case KindCM:
		return cm
	case KindData:
		return !cm
	}
	return true
}

func (f *Filter) passEvent(host string, e *ipoibcm.Event) bool {
	if f.Host != "" && host != f.Host {
		return false
	}
	if f.QPN != 0 && e.QPN != f.QPN && e.RemoteQPN != f.QPN {
		return false
	}
	return true // events explain data and CM alike, whatever the Kind
}

// recKind is what a record holds.
type recKind uint8

const (
	recUD recKind = iota
	recRC
	recRNR
	recEvent
	recNote     // the capture's own remarks (records dropped)
	recDatagram // a RoCEv2 packet as a real device carried it
)

// record is one tapped message or event, owned by the capture.
type record struct {
	kind           recKind
	at             time.Time
	srcGID, dstGID hca.GID
	srcQPN, dstQPN hca.QPN
	qkey           hca.QKey
	pkey           hca.PKey
	mtu            hca.MTU
	data           []byte
	text           string         // events and notes
	src, dst       netip.AddrPort // recDatagram
}

// recordOverhead is what a record costs beyond its data: the struct in
// the queue and in its spare, and the data's allocation header.
const recordOverhead = 2*int(unsafe.Sizeof(record{})) + 16

// size is what a record costs the byte budget.
func (r *record) size() int { return len(r.data) + len(r.text) + recordOverhead }

func messageRecord(m *soft.Message, at time.Time) record {
	r := record{at: at, srcGID: m.SrcGID, dstGID: m.DstGID, srcQPN: m.SrcQPN, dstQPN: m.DstQPN,
		qkey: m.QKey, pkey: m.PKey, mtu: m.MTU}
	switch m.Kind {
	case soft.MessageUD:
		r.kind = recUD
	case soft.MessageRC:
		r.kind = recRC
	case soft.MessageRNRNak:
		r.kind = recRNR
	}
	if len(m.Data) > 0 {
		r.data = append([]byte(nil), m.Data...)
	}
	return r
}

// passDatagram applies the filter to a RoCEv2 packet of a real device:
// the capture is of one device, so Host does not apply; QPN matches the
// BTH destination QP or, for UD, the DETH source QP.
func (f *Filter) passDatagram(pkt []byte) bool {
	var p wire.Packet
	if wire.ParsePacket(pkt, &p) != nil {
		return f.Kind == KindAll && f.QPN == 0
	}
	ud := p.BTH.Opcode == wire.OpUDSendOnly
	dst, src := hca.QPN(p.BTH.DestQP), hca.QPN(0)
	if ud {
		src = hca.QPN(p.DETH.SrcQP)
	}
	if f.QPN != 0 && dst != f.QPN && src != f.QPN {
		return false
	}
	return f.passKind(ud && (dst == gsiQPN || src == gsiQPN))
}

func datagramRecord(src, dst netip.AddrPort, pkt []byte, at time.Time) record {
	return record{kind: recDatagram, at: at, src: src, dst: dst, data: append([]byte(nil), pkt...)}
}

// maxEventText bounds an event comment (pcapng options are at most 64 KiB).
const maxEventText = 1024

func eventRecord(host string, e *ipoibcm.Event) record {
	text := host + ": " + e.String()
	if len(text) > maxEventText {
		text = text[:maxEventText]
	}
	return record{kind: recEvent, at: e.At, text: text, srcQPN: e.QPN, srcGID: e.Peer}
}
