package offload

import (
	"encoding/binary"

	"github.com/ipoibcm/ipoib/internal/packet"
)

// CompletePartial finishes a checksum the sender left partial, as a NIC
// does for CHECKSUM_PARTIAL / VIRTIO_NET_HDR_F_NEEDS_CSUM: the field at
// start+off already holds the folded pseudo-header sum; the one's
// complement of the sum from start to the end of frame goes there. The
// caller has checked that start+off+2 <= len(frame).
func CompletePartial(frame []byte, start, off int) {
	binary.BigEndian.PutUint16(frame[start+off:], PartialSum(frame, start, off))
}

// PartialSum is the checksum CompletePartial would write, for a caller
// that puts it into a copy of the frame rather than the frame itself.
func PartialSum(frame []byte, start, off int) uint16 {
	s := ^packet.Sum(frame[start:], 0)
	if s == 0 && off == 6 {
		// A UDP checksum of 0 means "none"; RFC 768 sends all ones.
		s = 0xFFFF
	}
	return s
}

// pseudoSum is the folded sum of the TCP/UDP pseudo header for an L4
// segment of l4len bytes.
func pseudoSum(frame []byte, h *Headers, l4len int) uint16 {
	return packet.PseudoHeaderSum(frame[h.L3:], h.IPv6, h.Proto, l4len)
}

// fill writes the IPv4 header checksum and the full L4 checksum of the
// packet described by h, ignoring what those fields held.
func fill(frame []byte, h *Headers) {
	if !h.IPv6 {
		packet.PutIPv4Checksum(frame[h.L3:h.L4])
	}
	l4 := frame[h.L4:h.Len]
	co := h.CsumOffset()
	l4[co], l4[co+1] = 0, 0
	s := ^packet.Sum(l4, pseudoSum(frame, h, len(l4)))
	if s == 0 && h.Proto == ProtoUDP {
		s = 0xFFFF
	}
	binary.BigEndian.PutUint16(l4[co:], s)
}

// fillSplit is fill for a packet held as its headers (hdr, h.End bytes)
// and its L4 payload (pay, h.Len-h.End bytes). The L4 header is a
// multiple of 4 bytes long, so the sum carries on over pay unshifted.
func fillSplit(hdr, pay []byte, h *Headers) {
	if !h.IPv6 {
		packet.PutIPv4Checksum(hdr[h.L3:h.L4])
	}
	l4 := hdr[h.L4:h.End]
	co := h.CsumOffset()
	l4[co], l4[co+1] = 0, 0
	s := ^packet.Sum(pay, packet.Sum(l4, pseudoSum(hdr, h, h.Len-h.L4)))
	if s == 0 && h.Proto == ProtoUDP {
		s = 0xFFFF
	}
	binary.BigEndian.PutUint16(l4[co:], s)
}

// FillChecksums parses the packet at l3off and writes its IPv4 header
// checksum and TCP/UDP checksum from scratch: what an HCA does for a send
// with IP checksum offload (IB_SEND_IP_CSUM). It returns the parsed
// headers.
func FillChecksums(frame []byte, l3off int) (Headers, error) {
	h, err := Parse(frame, l3off)
	if err != nil {
		return h, err
	}
	fill(frame, &h)
	return h, nil
}

// VerifyChecksums reports whether the packet at l3off parses and carries a
// valid IPv4 header checksum and a valid TCP/UDP checksum (a UDP checksum
// of zero, "none", is valid only over IPv4). It is what lets a receiver
// claim IB_WC_IP_CSUM_OK / CHECKSUM_UNNECESSARY.
func VerifyChecksums(frame []byte, l3off int) bool {
	h, err := Parse(frame, l3off)
	if err != nil {
		return false
	}
	if !h.IPv6 && !packet.IPv4ChecksumValid(frame[h.L3:h.L4]) {
		return false
	}
	l4 := frame[h.L4:h.Len]
	if h.Proto == ProtoUDP && l4[6] == 0 && l4[7] == 0 {
		return !h.IPv6
	}
	return packet.Sum(l4, pseudoSum(frame, &h, len(l4))) == 0xFFFF
}

// fillPartial writes the IPv4 header checksum and leaves the L4 checksum
// field holding the pseudo-header sum, as Linux does for CHECKSUM_PARTIAL.
func fillPartial(frame []byte, h *Headers) {
	if !h.IPv6 {
		packet.PutIPv4Checksum(frame[h.L3:h.L4])
	}
	binary.BigEndian.PutUint16(frame[h.L4+h.CsumOffset():], pseudoSum(frame, h, h.Len-h.L4))
}

// SetPartial turns the packet at l3off from "checksum known good" into
// CHECKSUM_PARTIAL form: its L4 checksum field gets the pseudo-header
// sum, so whoever completes it (CompletePartial, or a kernel forwarding
// it) computes the same checksum again, and whoever delivers it locally
// trusts it. It is how a verified checksum (CHECKSUM_UNNECESSARY) is
// passed to a Linux TAP, whose write path ignores VIRTIO_NET_HDR_F_DATA_VALID.
// The IPv4 header checksum is left as it is. It returns the parsed
// headers; CsumStart is h.L4 and CsumOffset h.CsumOffset().
func SetPartial(frame []byte, l3off int) (Headers, error) {
	h, err := Parse(frame, l3off)
	if err != nil {
		return h, err
	}
	binary.BigEndian.PutUint16(frame[h.L4+h.CsumOffset():], pseudoSum(frame, &h, h.Len-h.L4))
	return h, nil
}

// FillPartial writes the IPv4 header checksum of the packet h describes
// and seeds its TCP/UDP checksum field with the pseudo-header sum over
// h.Len, leaving the frame in the CHECKSUM_PARTIAL state (NeedsCsum with
// CsumStart h.L4 and CsumOffset h.CsumOffset()) that CompletePartial
// finishes: what a GRO engine hands up for a frame it coalesced, as
// Linux's tcp4_gro_complete / tcp6_gro_complete do. The caller has
// written the packet's IP length fields to match h.Len.
func (h Headers) FillPartial(frame []byte) {
	fillPartial(frame, &h)
}
