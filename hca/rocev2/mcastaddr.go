package rocev2

import (
	"encoding/binary"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
)

// GroupAddr returns the IP multicast group a multicast send to mgid goes
// to and an attached QP receives on, for an underlay of family v4 (IPv4)
// or IPv6. ok is false when mgid is no multicast GID.
//
// IPv6: the MGID is the group, as rxe joins it (rxe_mcast.c): IPoIB's
// ff12:401b:<P_Key>::ffff:ffff is a link-local-scope IPv6 group, so the
// packet on the wire is exactly what rxe sends.
//
// IPv4: RoCEv2 (IBA annex A17) writes an IPv4 multicast group a.b.c.d as
// the IPv4-mapped GID ::ffff:a.b.c.d, and rxe joins a.b.c.d for such a
// GID. IPoIB's MGIDs are not IPv4-mapped (they start with 0xFF), so they
// are mapped into the administratively scoped range 239.0.0.0/8 (RFC
// 2365), the way 01:00:5e MACs keep the low bits of an IPv4 group: the
// low 24 bits of the MGID become x.y.z of 239.x.y.z, with the MGID's
// P_Key (bytes 4-5, full-member bit set by IPoIB) folded into x.y as
// x.y ^= ^P_Key, so the default partition 0xFFFF keeps the plain low
// bits and other partitions land on other groups:
//
//	ff12:401b:ffff::ffff:ffff (broadcast)      -> 239.255.255.255
//	ff12:401b:ffff::1 (all-hosts 224.0.0.1)    -> 239.0.0.1
//	ff12:601b:ffff::1:ff00:2 (solicited-node)  -> 239.0.0.2
//	ff12:401b:8001::ffff:ffff                  -> 239.128.1.255
//
// The mapping is many-to-one: MGIDs that agree in those 24 bits share a
// group (IPv4 groups that differ only in bits 24-27 of their low 28 bits,
// an IPv4 and an IPv6 group with the same low bits, like all-hosts and
// all-nodes above). The MGID is not in an IPv4 RoCEv2 packet, so a
// receiver delivers a packet on a shared group to every QP attached to
// any MGID that maps to it (with the packet's Q_Key and P_Key): a
// collision costs bandwidth, as a shared multicast MAC does on Ethernet,
// and IPoIB drops what is not for the host by IP destination.
func GroupAddr(mgid hca.GID, v4 bool) (addr netip.Addr, ok bool) {
	if !mgid.IsMulticast() {
		return netip.Addr{}, false
	}
	if !v4 {
		return netip.AddrFrom16(mgid), true
	}
	fold := ^binary.BigEndian.Uint16(mgid[4:6])
	return netip.AddrFrom4([4]byte{239, mgid[13] ^ byte(fold>>8), mgid[14] ^ byte(fold), mgid[15]}), true
}
