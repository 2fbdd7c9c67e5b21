package main

import (
	"fmt"
	"net"
	"net/netip"
)

// defaultAllow is --allow's default: every --peers address and the
// connected subnets of this host that contain the bind address (the
// prefix of the interface address it is, or, for a loopback address
// such as 127.0.0.2, of the one whose subnet holds it), which is where
// an IPoIB subnet's other hosts are on a flat underlay.
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
			if !ok {
				continue
			}
			ones, _ := ipn.Mask.Size()
			if ip.Is4In6() && len(ipn.Mask) == net.IPv6len {
				ones -= 96
			}
			p := netip.PrefixFrom(ip.Unmap(), ones).Masked()
			if !p.IsValid() || !p.Contains(bind) {
				continue
			}
			out = append(out, p)
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("default --allow: no local interface has %v (give --allow)", bind)
	}
	return out, nil
}
