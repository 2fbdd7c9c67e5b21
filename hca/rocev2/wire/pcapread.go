package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
// microsecond or nanosecond timestamps). pcapng is not read: capture with
// "tshark -F pcap".
type PcapReader struct {
	r        io.Reader
	order    binary.ByteOrder
	LinkType uint32
	hdr      [16]byte
	buf      []byte
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
	case 0x0a0d0d0a:
		return nil, fmt.Errorf("pcap file header: %w: pcapng is not supported; capture with -F pcap", ErrPcapFormat)
	default:
		return nil, fmt.Errorf("pcap file header: %w: magic % x", ErrPcapFormat, h[:4])
	}
	p.LinkType = p.order.Uint32(h[20:]) & 0x0FFFFFFF // high bits carry FCS flags
	return p, nil
}

// Next returns the next record's captured bytes, valid until the next
// call, and its original length; io.EOF at the end of the file.
func (p *PcapReader) Next() (data []byte, origLen int, err error) {
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
		switch frame[0] >> 4 {
		case 4:
			etherType = 0x0800
		case 6:
			etherType = 0x86dd
		}
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
	if len(ip) == 0 {
		return nil, nil, nil, false, DropTruncated
	}
	var hl, total int
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < IPv4HeaderLen {
			return nil, nil, nil, false, DropTruncated
		}
		hl = int(ip[0]&0xF) * 4
		total = int(binary.BigEndian.Uint16(ip[2:]))
		if ip[9] != 17 || binary.BigEndian.Uint16(ip[6:])&0x3FFF != 0 {
			return nil, nil, nil, false, nil // not UDP, or a fragment
		}
		if hl < IPv4HeaderLen || total < hl || total > len(ip) {
			return nil, nil, nil, false, DropTruncated
		}
	case 6:
		if len(ip) < IPv6HeaderLen {
			return nil, nil, nil, false, DropTruncated
		}
		if ip[6] != 17 {
			return nil, nil, nil, false, nil // extension headers are not used by RoCEv2
		}
		hl = IPv6HeaderLen
		total = hl + int(binary.BigEndian.Uint16(ip[4:]))
		if total > len(ip) {
			return nil, nil, nil, false, DropTruncated
		}
	default:
		return nil, nil, nil, false, nil
	}
	udp := ip[hl:total]
	if len(udp) < UDPHeaderLen {
		return nil, nil, nil, false, DropTruncated
	}
	if binary.BigEndian.Uint16(udp[2:]) != port && binary.BigEndian.Uint16(udp[0:]) != port {
		return nil, nil, nil, false, nil
	}
	ul := int(binary.BigEndian.Uint16(udp[4:]))
	if ul < UDPHeaderLen || ul > len(udp) {
		return nil, nil, nil, false, DropTruncated
	}
	return ip[:hl], udp[:UDPHeaderLen], udp[UDPHeaderLen:ul], true, nil
}
