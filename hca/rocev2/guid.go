package rocev2

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
)

// nodeGUIDFor derives the node GUID as rxe does (rxe_init_device_param:
// addrconf_addr_eui48 of its netdev's MAC): the modified EUI-64 of the MAC
// of the interface that holds the bound address. An address on no
// interface with a 48-bit MAC (loopback, a tunnel) falls back to the
// GID's interface ID, which is unique per device all the same.
func nodeGUIDFor(a netip.Addr) uint64 {
	if mac := macOf(a); mac != nil {
		return eui48to64(mac)
	}
	gid := hca.GIDFromAddr(a)
	return binary.BigEndian.Uint64(gid[8:])
}

// eui48to64 is Linux addrconf_addr_eui48: FF:FE in the middle and the
// universal/local bit flipped.
func eui48to64(mac net.HardwareAddr) uint64 {
	eui := [8]byte{mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]}
	return binary.BigEndian.Uint64(eui[:])
}

// macOf returns the 48-bit MAC of the interface that has a, or nil.
func macOf(a netip.Addr) net.HardwareAddr {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	for _, ifc := range ifs {
		if len(ifc.HardwareAddr) != 6 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if n, ok := ad.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a.Unmap() {
					return ifc.HardwareAddr
				}
			}
		}
	}
	return nil
}
