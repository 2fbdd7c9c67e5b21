package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"time"
)

// Link types of classic pcap files.
const (
	LinkTypeEthernet = 1
	// LinkTypeRaw: packets start with an IPv4 or IPv6 header.
	LinkTypeRaw = 101
	// LinkTypeIPoIB: 40-byte IPoIB pseudo-header, 4-byte IPoIB header,
	// then the packet (tshark decodes it).
	LinkTypeIPoIB = 242
)

const pcapSnapLen = 262144

// PcapWriter writes a classic (libpcap 2.4, microsecond) capture file.
type PcapWriter struct {
	w   io.Writer
	hdr [16]byte
}

// NewPcapWriter writes the file header for linkType and returns a writer.
func NewPcapWriter(w io.Writer, linkType uint32) (*PcapWriter, error) {
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], pcapSnapLen)
	binary.LittleEndian.PutUint32(h[20:], linkType)
	if _, err := w.Write(h[:]); err != nil {
		return nil, fmt.Errorf("pcap: write file header: %w", err)
	}
	return &PcapWriter{w: w}, nil
}

// WritePacket appends one record with timestamp ts.
func (p *PcapWriter) WritePacket(ts time.Time, data []byte) error {
	n := min(len(data), pcapSnapLen)
	binary.LittleEndian.PutUint32(p.hdr[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(p.hdr[4:], uint32(ts.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(p.hdr[8:], uint32(n))
	binary.LittleEndian.PutUint32(p.hdr[12:], uint32(len(data)))
	if _, err := p.w.Write(p.hdr[:]); err != nil {
		return fmt.Errorf("pcap: write record header: %w", err)
	}
	if _, err := p.w.Write(data[:n]); err != nil {
		return fmt.Errorf("pcap: write record: %w", err)
	}
	return nil
}

// WritePcap writes a whole capture of frames, one microsecond apart from
// a fixed epoch so output is reproducible.
func WritePcap(w io.Writer, linkType uint32, frames [][]byte) error {
	pw, err := NewPcapWriter(w, linkType)
	if err != nil {
		return err
	}
	base := time.Unix(1_700_000_000, 0)
	for i, f := range frames {
		if err := pw.WritePacket(base.Add(time.Duration(i)*time.Microsecond), f); err != nil {
			return fmt.Errorf("frame %d: %w", i, err)
		}
	}
	return nil
}
