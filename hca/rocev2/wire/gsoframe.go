package wire

import (
	"errors"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// maxSegmentLen bounds the datagram size CheckGSOSuperFrame looks for: a
// UD packet at the largest path MTU, with pad.
const maxSegmentLen = BTHLen + DETHLen + 4096 + 3 + ICRCLen

// CheckGSOSuperFrame verifies a captured RoCEv2 datagram that is really a
// UDP GSO super-packet: a sender's run of equal-sized datagrams (the last
// may be shorter) that a capture point before segmentation (veth, lo)
// records as one frame. The segment size is not in the frame, so it is
// found: the first size at which the next bytes start a BTH of the same
// transport and P_Key and the first segment's ICRC verifies. Segment j
// is then checked with the headers segmentation gives it: its own
// lengths and IPv4 ID base+j. It returns the number of segments, or
// DropBadICRC when no split verifies.
func CheckGSOSuperFrame(ipHdr, udpHdr, pkt []byte) (int, error) {
	if len(pkt) < 2*(BTHLen+ICRCLen) || len(ipHdr) < IPv4HeaderLen || len(udpHdr) < UDPHeaderLen {
		return 0, DropBadICRC
	}
	var ip [IPv6HeaderLen]byte
	var udp [UDPHeaderLen]byte
	if len(ipHdr) > len(ip) {
		return 0, DropBadICRC
	}
	copy(udp[:], udpHdr)
	hl := copy(ip[:], ipHdr)
	v4 := header.IPVersion(ip[:]) == header.IPv4Version
	var baseID uint16
	if v4 {
		baseID = header.IPv4(ip[:]).ID()
	}
	// segment rewrites the headers for segment j of n bytes and checks it.
	segment := func(j int, b []byte) error {
		if v4 {
			h := header.IPv4(ip[:])
			h.SetTotalLength(uint16(hl + UDPHeaderLen + len(b)))
			h.SetID(baseID + uint16(j))
		} else {
			header.IPv6(ip[:]).SetPayloadLength(uint16(UDPHeaderLen + len(b)))
		}
		header.UDP(udp[:]).SetLength(uint16(UDPHeaderLen + len(b)))
		return CheckICRC(ip[:hl], udp[:], b)
	}
	for s := BTHLen + ICRCLen; s < len(pkt)-BTHLen && s <= maxSegmentLen; s++ {
		next := pkt[s:]
		if next[0]>>5 != pkt[0]>>5 || next[1]&0xF != 0 || next[2] != pkt[2] || next[3] != pkt[3] {
			continue
		}
		if segment(0, pkt[:s]) != nil {
			continue
		}
		n := 1
		for rest := pkt[s:]; len(rest) > 0; n++ {
			b := rest[:min(s, len(rest))]
			if err := segment(n, b); err != nil {
				if errors.Is(err, DropBadICRC) {
					return 0, DropBadICRC
				}
				return 0, err
			}
			rest = rest[len(b):]
		}
		return n, nil
	}
	return 0, DropBadICRC
}
