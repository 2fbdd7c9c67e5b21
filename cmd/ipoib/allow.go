package main

import (
	"fmt"
	"net"
	"net/netip"
)

// defaultAllow is --allow's default: every --peers address and the
// subnets of the local interface that holds the bind address (its
// connected routes), which is where an IPoIB subnet's other hosts are
// on a flat underlay.
func defaultAllow(bind netip.Addr, peers []netip.Addr) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range peers {
		out = append(out, netip.PrefixFrom(p, p.BitLen()))
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("default --allow: list interfaces: %w", err)
	}
	found := false
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok || ip.Unmap() != bind {
				continue
			}
			ones, _ := ipn.Mask.Size()
			if ip.Is4In6() && len(ipn.Mask) == net.IPv6len {
				ones -= 96
			}
			out = append(out, netip.PrefixFrom(bind, ones).Masked())
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("default --allow: no local interface has %v (give --allow)", bind)
	}
	return out, nil
}
