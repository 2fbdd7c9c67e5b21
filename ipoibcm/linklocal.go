package ipoibcm

import (
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
)

// LinkLocal is the IPv6 link-local address Linux gives ib0
// (addrconf_ifid_infiniband): fe80::/64 with the last 8 bytes of the
// 20-byte hardware address, the port GID's interface ID, with the
// universal/local bit set. The host's TAP gets it instead of the one
// derived from its MAC, so ib0's address names the port as on Linux.
func LinkLocal(gid hca.GID) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	copy(a[8:], gid[8:])
	a[8] |= 2
	return netip.AddrFrom16(a)
}

// linkLocalSetter is a HostPort that can take ib0's link-local address
// (tap.Device); others keep theirs.
type linkLocalSetter interface {
	SetLinkLocal(netip.Addr) error
}
