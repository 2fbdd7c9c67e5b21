package ipoibcm

import (
	"encoding/binary"
	"net/netip"
)

// Minimal IP header inspection for the decisions the engine makes on host
// and wire packets: is it plausibly IP, where does it go, is it a
// multicast membership report. Everything checks lengths first; nothing
// here panics on bad input (FuzzIPInspect).

const (
	ipProtoIGMP       = 2
	ipProtoICMPv6     = 58
	ipv6HopByHop      = 0
	ndNeighborSolicit = 135

	igmpV1Report = 0x12
	igmpV2Report = 0x16
	igmpV3Report = 0x22
	mldV1Report  = 131
	mldV2Report  = 143
)

func validIPv4(p []byte) bool {
	if len(p) < 20 || p[0]>>4 != 4 {
		return false
	}
	ihl := int(p[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(p[2:4]))
	return ihl >= 20 && total >= ihl && total <= len(p)
}

func validIPv6(p []byte) bool {
	if len(p) < 40 || p[0]>>4 != 6 {
		return false
	}
	return 40+int(binary.BigEndian.Uint16(p[4:6])) <= len(p)
}

func ipv4Dst(p []byte) netip.Addr {
	if len(p) < 20 {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(p[16:20]))
}

func ipv6Src(p []byte) netip.Addr {
	if len(p) < 40 {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(p[8:24]))
}

func ipv6Dst(p []byte) netip.Addr {
	if len(p) < 40 {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(p[24:40]))
}

// solicitedNode is ff02::1:ffXX:XXXX for a.
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// igmpReportGroups returns the groups an IPv4 IGMP membership report (v1,
// v2 or v3) joins, appended to into; ok is false for anything else.
// Leave records and v3 "block" records are not reported: the engine never
// detaches (the broadcast group MTU and Linux's umcast default make a
// stale attachment harmless).
func igmpReportGroups(p []byte, into []netip.Addr) ([]netip.Addr, bool) {
	if !validIPv4(p) || p[9] != ipProtoIGMP {
		return into, false
	}
	ihl := int(p[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(p[2:4]))
	m := p[ihl:total]
	if len(m) < 8 {
		return into, false
	}
	switch m[0] {
	case igmpV1Report, igmpV2Report:
		return append(into, netip.AddrFrom4([4]byte(m[4:8]))), true
	case igmpV3Report:
		n := int(binary.BigEndian.Uint16(m[6:8]))
		off := 8
		for range n {
			if off+8 > len(m) {
				break
			}
			recType, aux, nsrc := m[off], int(m[off+1]), int(binary.BigEndian.Uint16(m[off+2:off+4]))
			g := netip.AddrFrom4([4]byte(m[off+4 : off+8]))
			// MODE_IS_EXCLUDE(2), CHANGE_TO_EXCLUDE(4), ALLOW(5) and a
			// non-empty include list mean "receiving".
			if recType == 2 || recType == 4 || recType == 5 || ((recType == 1 || recType == 3) && nsrc > 0) {
				into = append(into, g)
			}
			off += 8 + 4*nsrc + 4*aux
		}
		return into, true
	}
	return into, false
}

// mldReportGroups is igmpReportGroups for MLDv1/v2 (behind the hop-by-hop
// Router Alert header MLD uses).
func mldReportGroups(p []byte, into []netip.Addr) ([]netip.Addr, bool) {
	if !validIPv6(p) {
		return into, false
	}
	next := p[6]
	off := 40
	end := 40 + int(binary.BigEndian.Uint16(p[4:6]))
	if next == ipv6HopByHop {
		if off+8 > end {
			return into, false
		}
		next = p[off]
		off += (int(p[off+1]) + 1) * 8
	}
	if next != ipProtoICMPv6 || off+8 > end {
		return into, false
	}
	m := p[off:end]
	switch m[0] {
	case mldV1Report:
		if len(m) < 24 {
			return into, false
		}
		return append(into, netip.AddrFrom16([16]byte(m[8:24]))), true
	case mldV2Report:
		n := int(binary.BigEndian.Uint16(m[6:8]))
		o := 8
		for range n {
			if o+20 > len(m) {
				break
			}
			recType, aux, nsrc := m[o], int(m[o+1]), int(binary.BigEndian.Uint16(m[o+2:o+4]))
			g := netip.AddrFrom16([16]byte(m[o+4 : o+20]))
			if recType == 2 || recType == 4 || recType == 5 || ((recType == 1 || recType == 3) && nsrc > 0) {
				into = append(into, g)
			}
			o += 20 + 16*nsrc + 4*aux
		}
		return into, true
	}
	return into, false
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
	return len(p) >= 20 && p[16] == 255 && p[17] == 255 && p[18] == 255 && p[19] == 255
}

const (
	arpOpRequest = 1
	arpOpReply   = 2
)

// ipSrc is the source address of an IPv4 or IPv6 packet.
func ipSrc(etherType uint16, p []byte) netip.Addr {
	switch etherType {
	case 0x0800:
		if len(p) >= 20 {
			return netip.AddrFrom4([4]byte(p[12:16]))
		}
	case 0x86DD:
		return ipv6Src(p)
	}
	return netip.Addr{}
}
