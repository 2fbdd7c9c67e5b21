package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// More link types a live capture produces (tshark -i any gives SLL).
const (
	LinkTypeLinuxSLL  = 113
	LinkTypeLinuxSLL2 = 276
)

// ErrPcapFormat is wrapped by every malformed-capture error.
var ErrPcapFormat = errors.New("malformed pcap")

// maxPcapRecord bounds one record so a corrupt length cannot make the
// reader allocate without limit.
const maxPcapRecord = 1 << 20

// PcapReader reads a classic libpcap capture (either byte order,
// microsecond or nanosecond timestamps) or a pcapng file (enhanced and
// simple packet blocks of any number of interfaces and sections; other
// blocks are skipped).
type PcapReader struct {
	r     io.Reader
	order binary.ByteOrder
	// LinkType is the link type of the file, or for pcapng of the
	// interface of the record Next returned last.
	LinkType uint32
	hdr      [16]byte
	buf      []byte

	ng      bool
	ngLinks []uint32 // link type per interface of the current section
}

// NewPcapReader reads the file header.
func NewPcapReader(r io.Reader) (*PcapReader, error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("pcap file header: %w: %w", ErrPcapFormat, err)
	}
	p := &PcapReader{r: r}
	switch binary.LittleEndian.Uint32(h[:]) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		p.order = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		p.order = binary.BigEndian
	case pcapngSHB:
		p.ng = true
		if err := p.startSection(h[:]); err != nil {
			return nil, err
		}
		return p, nil
	default:
		return nil, fmt.Errorf("pcap file header: %w: magic % x", ErrPcapFormat, h[:4])
	}
	p.LinkType = p.order.Uint32(h[20:]) & 0x0FFFFFFF // high bits carry FCS flags
	return p, nil
}

// Next returns the next record's captured bytes, valid until the next
// call, and its original length; io.EOF at the end of the file.
func (p *PcapReader) Next() (data []byte, origLen int, err error) {
	if p.ng {
		return p.nextNG()
	}
	if _, err := io.ReadFull(p.r, p.hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, 0, io.EOF
		}
		return nil, 0, fmt.Errorf("pcap record header: %w: %w", ErrPcapFormat, err)
	}
	incl, orig := p.order.Uint32(p.hdr[8:]), p.order.Uint32(p.hdr[12:])
	if incl > maxPcapRecord {
		return nil, 0, fmt.Errorf("pcap record of %d bytes: %w", incl, ErrPcapFormat)
	}
	if cap(p.buf) < int(incl) {
		p.buf = make([]byte, incl)
	}
	p.buf = p.buf[:incl]
	if _, err := io.ReadFull(p.r, p.buf); err != nil {
		return nil, 0, fmt.Errorf("pcap record: %w: %w", ErrPcapFormat, err)
	}
	return p.buf, int(orig), nil
}

// IPPacket strips the link-layer header of a captured frame and returns
// the IPv4 or IPv6 packet; ok is false for other protocols (ARP, LLDP)
// and err is set for frames too short for their link header.
func IPPacket(linkType uint32, frame []byte) (ip []byte, ok bool, err error) {
	var etherType uint16
	switch linkType {
	case LinkTypeEthernet:
		if len(frame) < 14 {
			return nil, false, DropTruncated
		}
		etherType, frame = binary.BigEndian.Uint16(frame[12:]), frame[14:]
		for etherType == 0x8100 || etherType == 0x88a8 { // VLAN tags
			if len(frame) < 4 {
				return nil, false, DropTruncated
			}
			etherType, frame = binary.BigEndian.Uint16(frame[2:]), frame[4:]
		}
	case LinkTypeLinuxSLL:
		if len(frame) < 16 {
			return nil, false, DropTruncated
		}
		etherType, frame = binary.BigEndian.Uint16(frame[14:]), frame[16:]
	case LinkTypeLinuxSLL2:
		if len(frame) < 20 {
			return nil, false, DropTruncated
		}
		etherType, frame = binary.BigEndian.Uint16(frame[0:]), frame[20:]
	case LinkTypeRaw:
		if len(frame) == 0 {
			return nil, false, DropTruncated
		}
		switch header.IPVersion(frame) {
		case header.IPv4Version:
			etherType = uint16(header.IPv4ProtocolNumber)
		case header.IPv6Version:
			etherType = uint16(header.IPv6ProtocolNumber)
		}
	case LinkTypeUpperPDU:
		return nil, false, nil // text records (ipoib capture's events), never IP
	default:
		return nil, false, fmt.Errorf("link type %d: %w", linkType, ErrPcapFormat)
	}
	if etherType != 0x0800 && etherType != 0x86dd {
		return nil, false, nil
	}
	return frame, true, nil
}

// RoCEv2Datagram splits an IP packet into its IP header, UDP header and
// UDP payload when it is an unfragmented UDP datagram to or from port (as
// tshark's udp.port matches); ok is
// false for any other packet, err is set for a UDP-to-port packet whose
// headers are cut or inconsistent.
func RoCEv2Datagram(ip []byte, port uint16) (ipHdr, udpHdr, payload []byte, ok bool, err error) {
	h, err := packet.ParseIP(ip)
	switch {
	case errors.Is(err, packet.ErrNotIP):
		return nil, nil, nil, false, nil
	case errors.Is(err, packet.ErrTruncated):
		return nil, nil, nil, false, DropTruncated
	case h.Protocol != packet.ProtoUDP || h.Fragment:
		// Not UDP, or a fragment; RoCEv2 uses no IPv6 extension headers.
		return nil, nil, nil, false, nil
	case err != nil:
		return nil, nil, nil, false, DropTruncated
	}
	udp := header.UDP(ip[h.HeaderLen:h.Len])
	if len(udp) < UDPHeaderLen {
		return nil, nil, nil, false, DropTruncated
	}
	if udp.DestinationPort() != port && udp.SourcePort() != port {
		return nil, nil, nil, false, nil
	}
	ul := int(udp.Length())
	if ul < UDPHeaderLen || ul > len(udp) {
		return nil, nil, nil, false, DropTruncated
	}
	return ip[:h.HeaderLen], udp[:UDPHeaderLen], udp[UDPHeaderLen:ul], true, nil
}

// startSection reads the rest of a section header block whose first 24
// bytes are h: the byte order and the block's remaining bytes.
func (p *PcapReader) startSection(h []byte) error {
	switch binary.LittleEndian.Uint32(h[8:]) {
	case pcapngByteOrderMagic:
		p.order = binary.LittleEndian
	case 0x4D3C2B1A:
		p.order = binary.BigEndian
	default:
		return fmt.Errorf("pcapng section header: %w: byte-order magic % x", ErrPcapFormat, h[8:12])
	}
	n := p.order.Uint32(h[4:])
	if n < 28 || n%4 != 0 || n > maxPcapRecord {
		return fmt.Errorf("pcapng section header of %d bytes: %w", n, ErrPcapFormat)
	}
	if _, err := io.CopyN(io.Discard, p.r, int64(n-24)); err != nil {
		return fmt.Errorf("pcapng section header: %w: %w", ErrPcapFormat, err)
	}
	p.ngLinks = p.ngLinks[:0]
	return nil
}

// nextNG reads blocks until a packet: interface descriptions are
// remembered, a new section starts over, anything else is skipped.
func (p *PcapReader) nextNG() ([]byte, int, error) {
	for {
		var h [8]byte
		if _, err := io.ReadFull(p.r, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, 0, io.EOF
			}
			return nil, 0, fmt.Errorf("pcapng block header: %w: %w", ErrPcapFormat, err)
		}
		if binary.LittleEndian.Uint32(h[:]) == pcapngSHB {
			var rest [16]byte
			if _, err := io.ReadFull(p.r, rest[:]); err != nil {
				return nil, 0, fmt.Errorf("pcapng section header: %w: %w", ErrPcapFormat, err)
			}
			if err := p.startSection(append(h[:], rest[:]...)); err != nil {
				return nil, 0, err
			}
			continue
		}
		typ, n := p.order.Uint32(h[:]), p.order.Uint32(h[4:])
		if n < 12 || n%4 != 0 || n > maxPcapRecord {
			return nil, 0, fmt.Errorf("pcapng block of %d bytes: %w", n, ErrPcapFormat)
		}
		body := int(n) - 12
		if cap(p.buf) < body+4 {
			p.buf = make([]byte, body+4)
		}
		b := p.buf[:body+4] // body and the trailing length
		if _, err := io.ReadFull(p.r, b); err != nil {
			return nil, 0, fmt.Errorf("pcapng block: %w: %w", ErrPcapFormat, err)
		}
		if p.order.Uint32(b[body:]) != n {
			return nil, 0, fmt.Errorf("pcapng block lengths differ: %w", ErrPcapFormat)
		}
		b = b[:body]
		switch typ {
		case pcapngIDB:
			if len(b) < 8 {
				return nil, 0, fmt.Errorf("pcapng interface block of %d bytes: %w", n, ErrPcapFormat)
			}
			if len(p.ngLinks) >= 1<<16 {
				return nil, 0, fmt.Errorf("pcapng: more than 65536 interfaces: %w", ErrPcapFormat)
			}
			p.ngLinks = append(p.ngLinks, uint32(p.order.Uint16(b)))
		case pcapngEPB:
			if len(b) < 20 {
				return nil, 0, fmt.Errorf("pcapng packet block of %d bytes: %w", n, ErrPcapFormat)
			}
			iface, incl, orig := p.order.Uint32(b), p.order.Uint32(b[12:]), p.order.Uint32(b[16:])
			if int(iface) >= len(p.ngLinks) || int64(incl) > int64(len(b)-20) {
				return nil, 0, fmt.Errorf("pcapng packet of interface %d, %d bytes: %w", iface, incl, ErrPcapFormat)
			}
			p.LinkType = p.ngLinks[iface]
			return b[20 : 20+incl], int(orig), nil
		case pcapngSPB:
			if len(b) < 4 || len(p.ngLinks) == 0 {
				return nil, 0, fmt.Errorf("pcapng simple packet block: %w", ErrPcapFormat)
			}
			orig := p.order.Uint32(b)
			p.LinkType = p.ngLinks[0]
			return b[4:min(len(b), 4+int(orig))], int(orig), nil
		}
	}
}
