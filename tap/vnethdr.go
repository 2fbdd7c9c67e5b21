package tap

import (
	"encoding/binary"
	"fmt"

	"github.com/ipoibcm/ipoib/offload"
)

// VnetHdrLen is the size of the legacy struct virtio_net_hdr the TAP is
// told to use (TUNSETVNETHDRSZ): no num_buffers field, since a TAP read
// never merges buffers.
const VnetHdrLen = 10

// EthHdrLen is the Ethernet header in front of every TAP frame. In TAP
// mode the virtio header's CsumStart and HdrLen count it.
const EthHdrLen = 14

// GSOType is the virtio_net_hdr gso_type (include/uapi/linux/virtio_net.h).
type GSOType uint8

// GSO types. GSOUDP (UFO, IP fragmentation of a UDP datagram) is
// deprecated and never enabled here; GSOUDPL4 is USO (UDP_SEGMENT).
const (
	GSONone  GSOType = 0
	GSOTCPv4 GSOType = 1
	GSOUDP   GSOType = 3
	GSOTCPv6 GSOType = 4
	GSOUDPL4 GSOType = 5
	// GSOECN is a flag bit: the TCP flow uses ECN (CWR handling).
	GSOECN GSOType = 0x80
)

func (t GSOType) String() string {
	s := ""
	switch t &^ GSOECN {
	case GSONone:
		s = "none"
	case GSOTCPv4:
		s = "tcpv4"
	case GSOUDP:
		s = "udp"
	case GSOTCPv6:
		s = "tcpv6"
	case GSOUDPL4:
		s = "udp_l4"
	default:
		s = fmt.Sprintf("GSOType(%d)", uint8(t&^GSOECN))
	}
	if t&GSOECN != 0 {
		s += "|ecn"
	}
	return s
}

// Virtio header flags.
const (
	// VnetNeedsCsum: the checksum from CsumStart to the end of the frame
	// is partial (pseudo header only) and must be completed into
	// CsumStart+CsumOffset (CHECKSUM_PARTIAL).
	VnetNeedsCsum = 0x1
	// VnetDataValid: the checksum was verified (CHECKSUM_UNNECESSARY).
	VnetDataValid = 0x2
)

// VnetHdr is the per-frame offload metadata a TAP with IFF_VNET_HDR puts
// in front of each frame: the GSO type and size, where a partial checksum
// starts and lies, and whether it needs completing or is already known
// good. Offsets count from the start of the Ethernet header.
type VnetHdr struct {
	Flags      uint8
	GSOType    GSOType
	HdrLen     uint16 // Ethernet + IP + L4 headers (a hint)
	GSOSize    uint16 // L4 payload bytes per segment
	CsumStart  uint16
	CsumOffset uint16
}

// NeedsCsum reports VnetNeedsCsum.
func (h VnetHdr) NeedsCsum() bool { return h.Flags&VnetNeedsCsum != 0 }

// DataValid reports VnetDataValid.
func (h VnetHdr) DataValid() bool { return h.Flags&VnetDataValid != 0 }

// IsGSO reports whether the frame is a super frame to segment.
func (h VnetHdr) IsGSO() bool { return h.GSOType&^GSOECN != GSONone }

// The kernel writes the legacy virtio header in native byte order
// (tun_is_little_endian: little endian unless TUNSETVNETBE).
var vnetOrder = binary.NativeEndian

// DecodeVnetHdr reads the header from b; b must hold VnetHdrLen bytes.
func DecodeVnetHdr(b []byte) (VnetHdr, bool) {
	if len(b) < VnetHdrLen {
		return VnetHdr{}, false
	}
	return VnetHdr{
		Flags:      b[0],
		GSOType:    GSOType(b[1]),
		HdrLen:     vnetOrder.Uint16(b[2:]),
		GSOSize:    vnetOrder.Uint16(b[4:]),
		CsumStart:  vnetOrder.Uint16(b[6:]),
		CsumOffset: vnetOrder.Uint16(b[8:]),
	}, true
}

// Encode writes the header into b[:VnetHdrLen].
func (h VnetHdr) Encode(b []byte) {
	_ = b[VnetHdrLen-1]
	b[0], b[1] = h.Flags, byte(h.GSOType)
	vnetOrder.PutUint16(b[2:], h.HdrLen)
	vnetOrder.PutUint16(b[4:], h.GSOSize)
	vnetOrder.PutUint16(b[6:], h.CsumStart)
	vnetOrder.PutUint16(b[8:], h.CsumOffset)
}

// VnetDrop names why a frame's virtio header was refused.
//
//go:generate go tool stringer -type=VnetDrop -linecomment
type VnetDrop uint8

// Reasons a vnet header is refused. Each is counted; none is fatal.
const (
	VnetOK VnetDrop = iota // ok
	// VnetDropShort: fewer bytes than the virtio header itself.
	VnetDropShort // vnet_short
	// VnetDropGSOType: an unknown GSO type, or UFO, which is never enabled.
	VnetDropGSOType // vnet_gso_type
	// VnetDropGSOSizeZero: a GSO frame with gso_size 0.
	VnetDropGSOSizeZero // vnet_gso_size_zero
	// VnetDropHdrLen: hdr_len points past the frame.
	VnetDropHdrLen // vnet_hdr_len_past_frame
	// VnetDropCsumOffset: the checksum field lies outside the packet, or
	// csum_offset is not TCP's 16 or UDP's 6.
	VnetDropCsumOffset // vnet_csum_outside_packet
	// VnetDropNotL4: a GSO type on a frame that is not the TCP or UDP
	// packet of that IP version (or whose headers do not parse).
	VnetDropNotL4 // vnet_gso_not_l4
	// VnetDropNoCsum: a GSO frame without NEEDS_CSUM: the segments'
	// checksums could not be produced.
	VnetDropNoCsum // vnet_gso_without_csum
	vnetDropCount
)

// VnetDropReasons is the number of VnetDrop values, VnetOK included.
const VnetDropReasons = int(vnetDropCount)

// Validate checks the header against the Ethernet frame it came with, so
// that a lying header (from a buggy kernel path, or written by whatever
// else holds the queue) is refused before software segmentation or
// checksum completion trusts it. For a GSO frame it returns the parsed
// headers (offsets from the start of frame).
func (h VnetHdr) Validate(frame []byte) (offload.Headers, VnetDrop) {
	var hd offload.Headers
	if int(h.HdrLen) > len(frame) {
		return hd, VnetDropHdrLen
	}
	if h.NeedsCsum() {
		start, off := int(h.CsumStart), int(h.CsumOffset)
		if start < EthHdrLen || start+off+2 > len(frame) {
			return hd, VnetDropCsumOffset
		}
	}
	var v6 bool
	var proto uint8
	switch h.GSOType &^ GSOECN {
	case GSONone:
		return hd, VnetOK
	case GSOTCPv4:
		proto = offload.ProtoTCP
	case GSOTCPv6:
		v6, proto = true, offload.ProtoTCP
	case GSOUDPL4:
		proto = offload.ProtoUDP
	default:
		return hd, VnetDropGSOType
	}
	if h.GSOSize == 0 {
		return hd, VnetDropGSOSizeZero
	}
	if !h.NeedsCsum() {
		return hd, VnetDropNoCsum
	}
	if len(frame) < EthHdrLen {
		return hd, VnetDropNotL4
	}
	et := binary.BigEndian.Uint16(frame[12:])
	hd, err := offload.Parse(frame, EthHdrLen)
	if err != nil || hd.Proto != proto || (h.GSOType&^GSOECN != GSOUDPL4 && hd.IPv6 != v6) ||
		(hd.IPv6 && et != 0x86DD) || (!hd.IPv6 && et != 0x0800) {
		return hd, VnetDropNotL4
	}
	if int(h.CsumStart) != hd.L4 || int(h.CsumOffset) != hd.CsumOffset() {
		return hd, VnetDropCsumOffset
	}
	return hd, VnetOK
}
