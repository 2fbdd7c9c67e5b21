package rocev2

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// vnetHdrLen is the size of struct virtio_net_hdr (linux/virtio_net.h),
// which a packet socket with PACKET_VNET_HDR puts in front of each
// packet.
const vnetHdrLen = 10

// virtio-net header GSO types: none, or UDP segmentation (a UDP_SEGMENT
// send that loopback or a veth carried whole, or datagrams a NIC's GRO
// merged). The ECN bit does not change the layout.
const (
	vnetGSONone  = 0
	vnetGSOUDPL4 = 5
	vnetGSOECN   = 0x80
)

// maxFrameSegments bounds the segments of one frame: the kernel's
// UDP_MAX_SEGMENTS is 128; a frame that claims more is malformed.
const maxFrameSegments = 128

// packetFrame is one IPv4 UDP packet read from the packet socket, its
// headers checked as the kernel's IP and UDP receive would check them.
type packetFrame struct {
	ipHdr  []byte // the IPv4 header as received, options included
	udpHdr []byte
	// payload is the UDP payload: one RoCEv2 packet, or with segSize
	// set the datagrams of a GSO packet, segSize bytes each but the
	// last, which the sender sent with IDs ID, ID+1, ...
	payload []byte
	segSize int
	from    netip.AddrPort
	dst     netip.AddrPort
}

// parsePacketFrame parses b, a virtio-net header, a link header of
// netOff bytes and an IPv4 packet (possibly with link-layer padding
// behind it), into f. Errors are
// wire.DropReasons: DropTruncated for lengths that do not add up,
// DropGarbage for anything that is not one unfragmented IPv4 UDP packet
// with a valid header checksum.
func parsePacketFrame(b []byte, netOff int, f *packetFrame) error {
	if netOff < 0 || len(b) < vnetHdrLen || len(b)-vnetHdrLen < netOff+wire.IPv4HeaderLen+wire.UDPHeaderLen {
		return wire.DropTruncated
	}
	gsoType, gsoSize := b[1]&^vnetGSOECN, int(binary.NativeEndian.Uint16(b[4:]))
	ip := b[vnetHdrLen+netOff:]
	h, err := packet.ParseIP(ip)
	if errors.Is(err, packet.ErrNotIP) || h.IPv6 {
		return wire.DropGarbage
	}
	if err != nil || h.Len < h.HeaderLen+wire.UDPHeaderLen {
		return wire.DropTruncated
	}
	ip = ip[:h.Len] // what follows is link-layer padding
	if h.Protocol != packet.ProtoUDP || h.Fragment {
		// Not UDP, or a fragment (MF or an offset): RoCEv2 senders set
		// DF, so no packet of theirs is ever one.
		return wire.DropGarbage
	}
	if !packet.IPv4ChecksumValid(ip) {
		return wire.DropGarbage
	}
	udp := header.UDP(ip[h.HeaderLen : h.HeaderLen+wire.UDPHeaderLen])
	if int(udp.Length()) != h.Len-h.HeaderLen {
		return wire.DropTruncated
	}
	v4 := header.IPv4(ip)
	f.ipHdr, f.udpHdr, f.payload = ip[:h.HeaderLen], udp, ip[h.HeaderLen+wire.UDPHeaderLen:]
	f.from = netip.AddrPortFrom(netip.AddrFrom4([4]byte(v4.SourceAddressSlice())), udp.SourcePort())
	f.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(v4.DestinationAddressSlice())), udp.DestinationPort())
	f.segSize = 0
	switch gsoType {
	case vnetGSONone:
	case vnetGSOUDPL4:
		if gsoSize <= 0 || (len(f.payload)+gsoSize-1)/gsoSize > maxFrameSegments {
			return wire.DropTruncated
		}
		if gsoSize < len(f.payload) {
			f.segSize = gsoSize
		}
	default:
		return wire.DropGarbage
	}
	return nil
}

// segments is how many datagrams the frame carries.
func (f *packetFrame) segments() int {
	if f.segSize == 0 {
		return 1
	}
	return (len(f.payload) + f.segSize - 1) / f.segSize
}

// segment returns datagram i of the frame and the IPv4 and UDP headers
// it had on the wire. A GSO segment's headers are the frame's with the
// lengths and ID the kernel gives segment i (inet_gso_segment numbers
// them from the super-packet's ID), written into hdr, which must hold
// len(f.ipHdr)+UDPHeaderLen bytes.
func (f *packetFrame) segment(i int, hdr []byte) (pkt, ipHdr, udpHdr []byte) {
	if f.segSize == 0 {
		return f.payload, f.ipHdr, f.udpHdr
	}
	off := i * f.segSize
	pkt = f.payload[off:min(off+f.segSize, len(f.payload))]
	ihl := len(f.ipHdr)
	n := copy(hdr, f.ipHdr)
	copy(hdr[n:], f.udpHdr)
	ipHdr, udpHdr = hdr[:ihl], hdr[ihl:ihl+wire.UDPHeaderLen]
	ip := header.IPv4(ipHdr)
	ip.SetTotalLength(uint16(ihl + wire.UDPHeaderLen + len(pkt)))
	ip.SetID(header.IPv4(f.ipHdr).ID() + uint16(i))
	header.UDP(udpHdr).SetLength(uint16(wire.UDPHeaderLen + len(pkt)))
	return pkt, ipHdr, udpHdr
}
