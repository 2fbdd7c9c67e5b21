package frame

import (
	"encoding/binary"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
)

// Multicast GID layout (Linux ip_ib_mc_map / ipv6_ib_mc_map).
const (
	// mgidScopeLinkLocal is the scope nibble of byte 1; Linux takes it from
	// the broadcast address, whose default scope is 2 (link-local).
	mgidScopeLinkLocal = 0x2
	mgidSignatureIPv4  = 0x401B
	mgidSignatureIPv6  = 0x601B
	// pkeyFullMember is set in every MGID's P_Key, as Linux does in
	// ipoib_ndo_init / update_parent_pkey.
	pkeyFullMember = 0x8000
)

// BroadcastMGID is the IPoIB broadcast group of a partition:
// ff12:401b:<pkey|0x8000>::ffff:ffff.
func BroadcastMGID(pkey hca.PKey) hca.GID {
	g := mgidHeader(mgidSignatureIPv4, pkey)
	binary.BigEndian.PutUint32(g[12:16], 0xFFFFFFFF)
	return g
}

// BroadcastHWAddr is the broadcast link-layer address: no flags, QPN
// 0xFFFFFF and the broadcast MGID.
func BroadcastHWAddr(pkey hca.PKey) HWAddr {
	return NewHWAddr(0, hca.QPNMulticast, BroadcastMGID(pkey))
}

// MulticastMGID maps an IP multicast group to its MGID: for IPv4 the low 28
// bits of the group (ip_ib_mc_map), for IPv6 the low 80 bits
// (ipv6_ib_mc_map), both with link-local scope. IPv4 255.255.255.255 maps to
// the broadcast MGID as the kernel's neighbour code does; a subnet-directed
// broadcast is not recognisable here and is the caller's business. The group
// is not checked to be multicast: the caller decides where to send.
func MulticastMGID(group netip.Addr, pkey hca.PKey) hca.GID {
	if group.Is4() || group.Is4In6() {
		v4 := group.Unmap().As4()
		addr := binary.BigEndian.Uint32(v4[:])
		if addr == 0xFFFFFFFF {
			return BroadcastMGID(pkey)
		}
		g := mgidHeader(mgidSignatureIPv4, pkey)
		binary.BigEndian.PutUint32(g[12:16], addr&0x0FFFFFFF)
		return g
	}
	g := mgidHeader(mgidSignatureIPv6, pkey)
	v6 := group.As16()
	copy(g[6:16], v6[6:16])
	return g
}

// MulticastHWAddr is the link-layer address of an IP multicast group: QPN
// 0xFFFFFF and the group's MGID.
func MulticastHWAddr(group netip.Addr, pkey hca.PKey) HWAddr {
	return NewHWAddr(0, hca.QPNMulticast, MulticastMGID(group, pkey))
}

func mgidHeader(signature uint16, pkey hca.PKey) hca.GID {
	var g hca.GID
	g[0] = 0xFF
	g[1] = 0x10 | mgidScopeLinkLocal
	binary.BigEndian.PutUint16(g[2:4], signature)
	binary.BigEndian.PutUint16(g[4:6], uint16(pkey)|pkeyFullMember)
	return g
}
