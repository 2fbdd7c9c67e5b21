package offload

// GSO is the kind of super frame a Meta describes: what segmentation the
// frame still needs before it may go on a link with a smaller MTU. The
// values follow virtio_net_hdr's gso_type so a TAP can copy them across.
type GSO uint8

// GSO kinds. UFO (IP fragmentation of a UDP datagram) is deprecated in
// Linux and never produced or accepted here; GSOUDPL4 is USO
// (UDP_SEGMENT), which cuts a UDP payload into datagrams of GSOSize.
const (
	GSONone  GSO = 0
	GSOTCPv4 GSO = 1
	GSOTCPv6 GSO = 4
	GSOUDPL4 GSO = 5
)

// Meta is the offload state of one frame as it crosses a host port, in
// the terms of Linux's skb (and virtio_net_hdr): whether it is a super
// frame and its segment size, and the state of its L4 checksum. Offsets
// count from the start of the frame, link header included, so a TAP's
// Meta counts the 14-byte Ethernet header as virtio does in TAP mode.
//
// The zero Meta is an ordinary frame whose checksums are complete but
// unverified (CHECKSUM_NONE): the receiver checks them itself.
type Meta struct {
	GSO GSO
	// ECN: the TCP flow of a GSO frame uses ECN, so CWR belongs on the
	// first segment only (SKB_GSO_TCP_ECN).
	ECN bool
	// GSOSize is the L4 payload per segment (the MSS) when GSO is set.
	GSOSize uint16
	// NeedsCsum: the L4 checksum field holds only the pseudo-header sum;
	// the sum over CsumStart to the end of the packet must still be folded
	// into CsumStart+CsumOffset (CHECKSUM_PARTIAL). A GSO frame always
	// carries it.
	NeedsCsum bool
	// CsumStart and CsumOffset locate the partial checksum when NeedsCsum.
	CsumStart, CsumOffset uint16
	// DataValid: the L4 (and IPv4 header) checksums were verified by
	// whoever delivered the frame (CHECKSUM_UNNECESSARY), so the host need
	// not verify them again.
	DataValid bool
}

// Caps is the set of offloads one side of a host port accepts from the
// other: the features a NIC advertises (NETIF_F_HW_CSUM, NETIF_F_TSO,
// NETIF_F_TSO6, NETIF_F_GSO_UDP_L4). A port that accepts none of them
// only ever moves complete, MTU-sized frames with zero Meta.
type Caps struct {
	Csum bool // partial checksums (NeedsCsum) may be passed across
	TSO4 bool // GSOTCPv4 super frames may be passed across
	TSO6 bool // GSOTCPv6 super frames
	USO  bool // GSOUDPL4 super frames (IPv4 and IPv6)
}

// Accepts reports whether a frame with m may be passed to a side that
// accepts c as it is, without completing its checksum or segmenting it.
func (c Caps) Accepts(m Meta) bool {
	if m.NeedsCsum && !c.Csum {
		return false
	}
	switch m.GSO {
	case GSONone:
		return true
	case GSOTCPv4:
		return c.TSO4
	case GSOTCPv6:
		return c.TSO6
	case GSOUDPL4:
		return c.USO
	}
	return false
}
