package netstack

import (
	"encoding/binary"
	"github.com/ipoibcm/ipoib/internal/packet"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// isStalePMTU reports whether frame is an ICMP fragmentation-needed or
// ICMPv6 packet-too-big reporting an MTU no smaller than linkMTU.
//
// Every packet the stack sends now fits linkMTU, so such a message can only
// be about a packet sent or queued before the link MTU went down (the engine
// answers what it read before a mode switch reached the host). It tells the
// stack nothing the link does not already enforce, and giving it to gVisor's
// TCP does harm: the connection's MSS drops while its flight, sent at the
// old MSS, is outstanding, and gVisor then counts that flight in the new,
// much smaller MSS. When the lost packets are the flight's tail, the RFC
// 6675 pipe stays above the congestion window after every retransmission
// timeout and the connection crawls at two segments per RTO (measured: 20 s
// and more to recover 4 MiB after a 65520 -> 4092 switch). Without it, TCP
// retransmits the lost segments at their old size, which the stack
// fragments or the link cuts to fit (segmenter), and recovers at once.
func isStalePMTU(frame []byte, linkMTU int) bool {
	if len(frame) < ethernetHeaderLen {
		return false
	}
	ip := frame[ethernetHeaderLen:]
	h, err := packet.ParseIPHeader(ip)
	if err != nil {
		return false
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case uint16(header.IPv4ProtocolNumber):
		if h.IPv6 || h.Protocol != packet.ProtoICMPv4 || len(ip) < h.HeaderLen+header.ICMPv4MinimumSize {
			return false
		}
		if h.Fragment {
			return false // a fragment: leave it to reassembly
		}
		icmp := header.ICMPv4(ip[h.HeaderLen:])
		if icmp.Type() != header.ICMPv4DstUnreachable || icmp.Code() != header.ICMPv4FragmentationNeeded {
			return false
		}
		mtu := int(icmp.MTU())
		// An MTU of zero is an RFC 1191 "old-style" message: gVisor
		// makes its own estimate, which is not ours to judge.
		return mtu != 0 && mtu >= linkMTU
	case uint16(header.IPv6ProtocolNumber):
		if !h.IPv6 || h.Protocol != packet.ProtoICMPv6 || len(ip) < header.IPv6MinimumSize+header.ICMPv6MinimumSize {
			return false
		}
		icmp := header.ICMPv6(ip[header.IPv6MinimumSize:])
		if icmp.Type() != header.ICMPv6PacketTooBig || len(icmp) < header.ICMPv6PacketTooBigMinimumSize {
			return false
		}
		return int64(icmp.MTU()) >= int64(linkMTU)
	}
	return false
}
