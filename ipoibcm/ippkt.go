package ipoibcm

import (
	"encoding/binary"
	"net/netip"

	"github.com/ipoibcm/ipoib/internal/packet"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Minimal IP header inspection for the decisions the engine makes on host
// and wire packets: is it plausibly IP, where does it go, is it a
// multicast membership report. Everything checks lengths first; nothing
// here panics on bad input (FuzzIPInspect).

const (
	ipProtoIGMP       = packet.ProtoIGMP
	ipProtoICMPv6     = packet.ProtoICMPv6
	ipv6HopByHop      = uint8(header.IPv6HopByHopOptionsExtHdrIdentifier)
	ndNeighborSolicit = 135

	igmpV1Report = 0x12
	igmpV2Report = 0x16
	igmpV2Leave  = 0x17
	igmpV3Report = 0x22
	mldV1Report  = 131
	mldV1Done    = 132
	mldV2Report  = 143
)

func validIPv4(p []byte) bool {
	_, _, ok := packet.IPv4Lengths(p)
	return ok
}

func validIPv6(p []byte) bool {
	_, ok := packet.IPv6Length(p)
	return ok
}

// validRead is validIPv4 or validIPv6, as the EtherType et names the
// version, from offload.ReadHeaders' reading h of the packet and its ip
// answer: the RX path reads a packet's headers once and checks them here.
func validRead(et uint16, h *offload.Headers, ip bool) bool {
	return ip && h.IPv6 == (et == frame.EtherTypeIPv6)
}

func ipv4Dst(p []byte) netip.Addr {
	if len(p) < header.IPv4MinimumSize {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(header.IPv4(p).DestinationAddressSlice()))
}

func ipv6Src(p []byte) netip.Addr {
	if len(p) < header.IPv6MinimumSize {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(header.IPv6(p).SourceAddressSlice()))
}

func ipv6Dst(p []byte) netip.Addr {
	if len(p) < header.IPv6MinimumSize {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(header.IPv6(p).DestinationAddressSlice()))
}

// solicitedNode is ff02::1:ffXX:XXXX for a.
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// mcastChange is one change of the host's multicast membership that an
// IGMP or MLD message from the host states.
type mcastChange struct {
	group netip.Addr
	join  bool // false: the host left the group
}

// mcastVerdict is what parseMcastReport made of a packet.
type mcastVerdict uint8

const (
	mcastNotReport mcastVerdict = iota // not an IGMP/MLD membership report or leave
	mcastReport                        // a well-formed report or leave: its changes
	mcastBadReport                     // a membership message that does not parse
)

// IGMP and MLD v2 group record types (RFC 3376 4.2.12, RFC 3810 5.2.12).
const (
	recModeIsInclude   = 1
	recModeIsExclude   = 2
	recChangeToInclude = 3
	recChangeToExclude = 4
	recAllowNewSources = 5
	recBlockOldSources = 6
)

// parseMcastReport appends to into the membership changes an IPv4 or IPv6
// packet from the host states: IGMPv1/v2 reports and v2 leaves, IGMPv3
// reports (RFC 3376), MLDv1 reports and done messages, MLDv2 reports (RFC
// 3810). Queries and every other packet are mcastNotReport. A v2 record
// joins when it puts the host in exclude mode (receive from all but a
// list) or includes sources; an include record without sources is a leave
// (Linux sends TO_IN({}) when the last socket leaves). BLOCK records only
// narrow the source list, which an IB multicast group cannot filter, so
// they change nothing. A membership message whose lengths, record types
// or group addresses do not hold together is mcastBadReport, and into
// comes back as it was: nothing in it is acted on.
func parseMcastReport(etherType uint16, p []byte, into []mcastChange) ([]mcastChange, mcastVerdict) {
	switch etherType {
	case 0x0800:
		return parseIGMP(p, into)
	case 0x86DD:
		return parseMLD(p, into)
	}
	return into, mcastNotReport
}

// mayBeMcastReport reports whether a valid IPv4 or IPv6 packet may be an
// IGMP or MLD message, from its protocol field alone (MLD rides ICMPv6,
// usually behind a hop-by-hop header): only those go to the multicast
// table to be parsed.
func mayBeMcastReport(etherType uint16, p []byte) bool {
	if etherType == 0x0800 {
		return header.IPv4(p).Protocol() == ipProtoIGMP
	}
	next := header.IPv6(p).NextHeader()
	return next == ipProtoICMPv6 || next == ipv6HopByHop
}

func parseIGMP(p []byte, into []mcastChange) ([]mcastChange, mcastVerdict) {
	h, err := packet.ParseIP(p)
	if err != nil || h.IPv6 || h.Protocol != ipProtoIGMP {
		return into, mcastNotReport
	}
	m := p[h.HeaderLen:h.Len]
	if len(m) < 1 {
		return into, mcastBadReport
	}
	switch m[0] {
	case igmpV1Report, igmpV2Report, igmpV2Leave:
		if len(m) < 8 {
			return into, mcastBadReport
		}
		g := netip.AddrFrom4([4]byte(m[4:8]))
		if !g.IsMulticast() {
			return into, mcastBadReport
		}
		return append(into, mcastChange{group: g, join: m[0] != igmpV2Leave}), mcastReport
	case igmpV3Report:
		if len(m) < 8 {
			return into, mcastBadReport
		}
		return parseV2Records(m[8:], int(binary.BigEndian.Uint16(m[6:8])), 4, into)
	}
	return into, mcastNotReport
}

// parseMLD reads MLD behind at most one hop-by-hop header (MLD carries
// the Router Alert option there), within the packet's IP length.
func parseMLD(p []byte, into []mcastChange) ([]mcastChange, mcastVerdict) {
	h, err := packet.ParseIP(p)
	if err != nil || !h.IPv6 {
		return into, mcastNotReport
	}
	next, off, ok := packet.IPv6PastHopByHop(p[:h.Len])
	if !ok || next != ipProtoICMPv6 || off >= h.Len {
		return into, mcastNotReport
	}
	m := p[off:h.Len]
	switch m[0] {
	case mldV1Report, mldV1Done:
		if len(m) < 24 {
			return into, mcastBadReport
		}
		g := netip.AddrFrom16([16]byte(m[8:24]))
		if !g.IsMulticast() {
			return into, mcastBadReport
		}
		return append(into, mcastChange{group: g, join: m[0] == mldV1Report}), mcastReport
	case mldV2Report:
		if len(m) < 8 {
			return into, mcastBadReport
		}
		return parseV2Records(m[8:], int(binary.BigEndian.Uint16(m[6:8])), 16, into)
	}
	return into, mcastNotReport
}

// parseV2Records reads n IGMPv3 / MLDv2 group records with addrLen-byte
// addresses from b: type, aux data length (in 32-bit words), source count,
// group, sources, aux data. Bytes after the last record are ignored.
func parseV2Records(b []byte, n, addrLen int, into []mcastChange) ([]mcastChange, mcastVerdict) {
	orig := len(into)
	off := 0
	for range n {
		if off+4+addrLen > len(b) {
			return into[:orig], mcastBadReport
		}
		recType, aux, nsrc := b[off], int(b[off+1]), int(binary.BigEndian.Uint16(b[off+2:off+4]))
		g, _ := netip.AddrFromSlice(b[off+4 : off+4+addrLen])
		off += 4 + addrLen + addrLen*nsrc + 4*aux
		if off > len(b) || !g.IsMulticast() || recType < recModeIsInclude || recType > recBlockOldSources {
			return into[:orig], mcastBadReport
		}
		switch {
		case recType == recModeIsExclude || recType == recChangeToExclude:
			into = append(into, mcastChange{group: g, join: true})
		case recType == recBlockOldSources:
		case nsrc > 0:
			into = append(into, mcastChange{group: g, join: true})
		case recType != recAllowNewSources:
			into = append(into, mcastChange{group: g, join: false})
		}
	}
	return into, mcastReport
}

// hostMulticastMAC is the Ethernet destination of an IP multicast packet
// (RFC 1112 / RFC 2464), broadcast for anything else.
func hostMulticastMAC(etherType uint16, p []byte) ([6]byte, bool) {
	switch etherType {
	case 0x0800:
		if d := ipv4Dst(p); d.IsMulticast() {
			b := d.As4()
			return [6]byte{0x01, 0x00, 0x5e, b[1] & 0x7f, b[2], b[3]}, true
		}
	case 0x86DD:
		if d := ipv6Dst(p); d.IsMulticast() {
			b := d.As16()
			return [6]byte{0x33, 0x33, b[12], b[13], b[14], b[15]}, true
		}
	}
	return [6]byte{}, false
}

// isIPv4Broadcast reports a limited broadcast destination.
func isIPv4Broadcast(p []byte) bool {
	return len(p) >= header.IPv4MinimumSize && [4]byte(header.IPv4(p).DestinationAddressSlice()) == [4]byte{255, 255, 255, 255}
}

const (
	arpOpRequest = 1
	arpOpReply   = 2
)

// ipSrc is the source address of an IPv4 or IPv6 packet.
func ipSrc(etherType uint16, p []byte) netip.Addr {
	switch etherType {
	case 0x0800:
		if len(p) >= header.IPv4MinimumSize {
			return netip.AddrFrom4([4]byte(header.IPv4(p).SourceAddressSlice()))
		}
	case 0x86DD:
		return ipv6Src(p)
	}
	return netip.Addr{}
}
