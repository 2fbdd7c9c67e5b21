package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"time"
)

// pcapng block types and options (draft-ietf-opsawg-pcapng).
const (
	pcapngSHB = 0x0A0D0D0A
	pcapngIDB = 0x00000001
	pcapngSPB = 0x00000003
	pcapngEPB = 0x00000006

	pcapngByteOrderMagic = 0x1A2B3C4D

	optEndOfOpt   = 0
	optComment    = 1
	optSHBUserApp = 4
	optIfName     = 2
	optIfTSResol  = 9
)

// LinkTypeUpperPDU is LINKTYPE_WIRESHARK_UPPER_PDU: each record names
// the dissector for its payload. ipoib capture's engine-event interface
// uses it to show each event as a line of text (also the record's
// comment).
const LinkTypeUpperPDU = 252

// PcapngInterface describes one interface of a pcapng section.
type PcapngInterface struct {
	Name     string
	LinkType uint16
}

// PcapngWriter writes a pcapng file: one section, little-endian, with
// nanosecond timestamps, and enhanced packet blocks that may carry a
// comment. It buffers one block at a time and allocates only when a
// record is larger than any before.
type PcapngWriter struct {
	w   io.Writer
	buf []byte
	n   int // interfaces
}

// NewPcapngWriter writes the section header and one interface
// description per element of ifaces; packet records name an interface by
// its index.
func NewPcapngWriter(w io.Writer, app string, ifaces []PcapngInterface) (*PcapngWriter, error) {
	p := &PcapngWriter{w: w, n: len(ifaces)}
	b := p.begin(pcapngSHB)
	b = binary.LittleEndian.AppendUint32(b, pcapngByteOrderMagic)
	b = binary.LittleEndian.AppendUint16(b, 1) // major
	b = binary.LittleEndian.AppendUint16(b, 0) // minor
	b = binary.LittleEndian.AppendUint64(b, ^uint64(0))
	b = appendOption(b, optSHBUserApp, []byte(app))
	b = appendOption(b, optEndOfOpt, nil)
	if err := p.end(b); err != nil {
		return nil, fmt.Errorf("pcapng: section header: %w", err)
	}
	for _, ifc := range ifaces {
		b := p.begin(pcapngIDB)
		b = binary.LittleEndian.AppendUint16(b, ifc.LinkType)
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint32(b, 0) // no snap length limit
		b = appendOption(b, optIfName, []byte(ifc.Name))
		b = appendOption(b, optIfTSResol, []byte{9}) // nanoseconds
		b = appendOption(b, optEndOfOpt, nil)
		if err := p.end(b); err != nil {
			return nil, fmt.Errorf("pcapng: interface %q: %w", ifc.Name, err)
		}
	}
	return p, nil
}

// WritePacket appends an enhanced packet block for interface iface with
// an optional comment.
func (p *PcapngWriter) WritePacket(iface int, ts time.Time, data []byte, comment string) error {
	if iface < 0 || iface >= p.n {
		return fmt.Errorf("pcapng: interface %d of %d", iface, p.n)
	}
	b := p.begin(pcapngEPB)
	ns := uint64(ts.UnixNano())
	b = binary.LittleEndian.AppendUint32(b, uint32(iface))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns>>32))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	b = appendPadded(b, data)
	if comment != "" {
		b = appendOption(b, optComment, []byte(comment))
		b = appendOption(b, optEndOfOpt, nil)
	}
	if err := p.end(b); err != nil {
		return fmt.Errorf("pcapng: packet: %w", err)
	}
	return nil
}

// begin starts a block in the buffer: type and a length placeholder.
func (p *PcapngWriter) begin(typ uint32) []byte {
	b := binary.LittleEndian.AppendUint32(p.buf[:0], typ)
	return binary.LittleEndian.AppendUint32(b, 0)
}

// end fills in the block length, repeats it at the end and writes.
func (p *PcapngWriter) end(b []byte) error {
	total := uint32(len(b) + 4)
	binary.LittleEndian.PutUint32(b[4:], total)
	b = binary.LittleEndian.AppendUint32(b, total)
	p.buf = b
	_, err := p.w.Write(b)
	return err
}

func appendOption(b []byte, code uint16, val []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(val)))
	return appendPadded(b, val)
}

func appendPadded(b, data []byte) []byte {
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
