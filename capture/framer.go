package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Interfaces of the pcapng file.
const (
	ifaceFabric = 0
	ifaceEvents = 1
)

// maxSeqState bounds the PSN and MSN tables: past it they start over, so a
// run with millions of short-lived QPs cannot grow them without limit
// (PSNs then restart at 0 for QPs seen again, which tshark does not mind).
const maxSeqState = 1 << 16

// rnrTimerCode is the RNR NAK timer the soft fabric's responders use.
const rnrTimerCode = 1

type qpKey struct {
	gid hca.GID
	qpn hca.QPN
}

// framer turns records into pcapng blocks: RoCEv2 frames on interface 0,
// events on interface 1. One goroutine owns it.
type framer struct {
	pw       *wire.PcapngWriter
	psn, msn map[qpKey]uint32
	pkt, frm []byte
	// packets counts the packet blocks written, on either interface: what
	// tshark lists as frames.
	packets uint64
	// limit stops the file at this many packet blocks (0: none); a record
	// that would pass it is cut, as tcpdump -c cuts a stream.
	limit uint64
}

// errFull is returned by write once the file holds limit packets.
var errFull = errors.New("capture: packet limit reached")

func newFramer(w io.Writer) (*framer, error) {
	pw, err := wire.NewPcapngWriter(w, "ipoib capture", []wire.PcapngInterface{
		{Name: "fabric", LinkType: wire.LinkTypeRaw},
		{Name: "events", LinkType: wire.LinkTypeUpperPDU},
	})
	if err != nil {
		return nil, err
	}
	return &framer{pw: pw, psn: map[qpKey]uint32{}, msn: map[qpKey]uint32{}}, nil
}

// nextPSN returns the PSN of the next packet k sends and advances it.
func (f *framer) nextPSN(k qpKey) uint32 {
	if len(f.psn) >= maxSeqState {
		clear(f.psn)
	}
	p := f.psn[k]
	f.psn[k] = (p + 1) & wire.PSNMask
	return p
}

func (f *framer) nextMSN(k qpKey) uint32 {
	if len(f.msn) >= maxSeqState {
		clear(f.msn)
	}
	m := (f.msn[k] + 1) & wire.PSNMask
	f.msn[k] = m
	return m
}

// write emits the blocks of one record.
func (f *framer) write(r *record) error {
	switch r.kind {
	case recEvent, recNote:
		f.frm = appendUpperPDU(f.frm[:0], "data-text-lines", r.text)
		return f.packet(ifaceEvents, r, f.frm, r.text)
	case recUD:
		spec := wire.PacketSpec{
			BTH:     wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(r.pkey), DestQP: uint32(r.dstQPN), PSN: f.nextPSN(qpKey{r.srcGID, r.srcQPN})},
			DETH:    wire.DETH{QKey: uint32(r.qkey), SrcQP: uint32(r.srcQPN)},
			Payload: r.data,
		}
		return f.frame(r, r.srcGID, r.dstGID, r.srcQPN, r.dstQPN, &spec)
	case recRC:
		return f.rc(r)
	case recDatagram:
		// The device's own packet, ICRC and all; AppendFrame computes the
		// ICRC again for the IP header this file gives it (ID 0), which
		// is what a receiver checks.
		frm, err := wire.AppendFrame(f.frm[:0], r.src, r.dst, r.data, false)
		if err != nil {
			return fmt.Errorf("capture: frame %v -> %v: %w", r.src, r.dst, err)
		}
		f.frm = frm
		return f.packet(ifaceFabric, r, frm, "")
	case recRNR:
		// The responder NAKs the sender's next PSN (the head message's
		// first packet), which it will send again.
		sender := qpKey{r.dstGID, r.dstQPN}
		spec := wire.PacketSpec{
			BTH:  wire.BTH{Opcode: wire.OpRCAck, PKey: uint16(r.pkey), DestQP: uint32(r.dstQPN), PSN: f.psn[sender]},
			AETH: wire.AETH{Syndrome: wire.RNRNAK(rnrTimerCode), MSN: f.msn[qpKey{r.srcGID, r.srcQPN}]},
		}
		return f.frame(r, r.srcGID, r.dstGID, r.srcQPN, r.dstQPN, &spec)
	}
	return fmt.Errorf("capture: record kind %d", r.kind)
}

// rc cuts an RC message into packets of the path MTU and acknowledges it.
func (f *framer) rc(r *record) error {
	mtu := int(r.mtu)
	if mtu <= 0 {
		mtu = int(hca.MTU4096)
	}
	src := qpKey{r.srcGID, r.srcQPN}
	data := r.data
	var last uint32
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), mtu)
		op := wire.OpRCSendMiddle
		switch {
		case first && n == len(data):
			op = wire.OpRCSendOnly
		case first:
			op = wire.OpRCSendFirst
		case n == len(data):
			op = wire.OpRCSendLast
		}
		last = f.nextPSN(src)
		spec := wire.PacketSpec{
			BTH:     wire.BTH{Opcode: op, PKey: uint16(r.pkey), DestQP: uint32(r.dstQPN), PSN: last, AckReq: op.EndsMessage()},
			Payload: data[:n],
		}
		if err := f.frame(r, r.srcGID, r.dstGID, r.srcQPN, r.dstQPN, &spec); err != nil {
			return err
		}
		data = data[n:]
	}
	ack := wire.PacketSpec{
		BTH:  wire.BTH{Opcode: wire.OpRCAck, PKey: uint16(r.pkey), DestQP: uint32(r.srcQPN), PSN: last},
		AETH: wire.AETH{Syndrome: wire.SyndromeACK, MSN: f.nextMSN(qpKey{r.dstGID, r.dstQPN})},
	}
	return f.frame(r, r.dstGID, r.srcGID, r.dstQPN, r.srcQPN, &ack)
}

// frame wraps one packet in IPv6 (IPv4 for v4-mapped GIDs) and UDP with
// the RoCEv2 source port of the QP pair, computes the ICRC and writes it.
func (f *framer) frame(r *record, src, dst hca.GID, srcQPN, dstQPN hca.QPN, spec *wire.PacketSpec) error {
	f.pkt = wire.AppendPacket(f.pkt[:0], spec)
	sport := wire.UDPSourcePort(uint32(srcQPN), uint32(dstQPN))
	sa, da := netip.AddrFrom16(src), netip.AddrFrom16(dst)
	frm, err := wire.AppendFrame(f.frm[:0], netip.AddrPortFrom(sa, sport), netip.AddrPortFrom(da, wire.RoCEv2Port), f.pkt, false)
	if err != nil {
		return fmt.Errorf("capture: frame %v -> %v: %w", sa, da, err)
	}
	f.frm = frm
	return f.packet(ifaceFabric, r, frm, "")
}

// packet writes one packet block of r unless the limit is reached.
func (f *framer) packet(iface int, r *record, data []byte, comment string) error {
	if f.limit > 0 && f.packets >= f.limit {
		return errFull
	}
	if err := f.pw.WritePacket(iface, r.at, data, comment); err != nil {
		return err
	}
	f.packets++
	if f.limit > 0 && f.packets == f.limit {
		return errFull
	}
	return nil
}

// Exported-PDU tags (Wireshark's exported_pdu.h): the dissector to hand
// the payload to, and the end of the tags.
const (
	expPDUTagEnd       = 0
	expPDUTagProtoName = 12
)

// appendUpperPDU frames text for LINKTYPE_WIRESHARK_UPPER_PDU so that
// Wireshark hands it to the named dissector (data-text-lines shows it as
// a line of text) instead of reporting an unknown link type.
func appendUpperPDU(b []byte, proto, text string) []byte {
	b = binary.BigEndian.AppendUint16(b, expPDUTagProtoName)
	n := (len(proto) + 3) &^ 3
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	b = append(b, proto...)
	b = append(b, make([]byte, n-len(proto))...)
	b = binary.BigEndian.AppendUint16(b, expPDUTagEnd)
	b = binary.BigEndian.AppendUint16(b, 0)
	return append(b, text...)
}
