package cli

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// AllowAny is the --allow value that accepts every underlay source.
const AllowAny = "any"

// ParseAllow parses --allow: comma-separated prefixes (a bare address is
// a host prefix) of --bind's family, or "any". The empty string returns
// nil, meaning the default, which only the running host can compute
// (the --peers and the subnet the bind address is on).
func ParseAllow(s string, v4 bool) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if strings.TrimSpace(s) == AllowAny {
		if v4 {
			return []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0)}, nil
		}
		return []netip.Prefix{netip.PrefixFrom(netip.IPv6Unspecified(), 0)}, nil
	}
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not an IP prefix or address", f)
			}
			if a.Zone() != "" {
				return nil, fmt.Errorf("%q: zones are not allowed", f)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if a := p.Addr(); a.Is4In6() {
			if p.Bits() < 96 {
				return nil, fmt.Errorf("%q: an IPv4-mapped prefix shorter than /96", f)
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		if p.Addr().Is4() != v4 {
			return nil, fmt.Errorf("%q is not of --bind's address family", f)
		}
		out = append(out, p.Masked())
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q names no prefix", s)
	}
	return out, nil
}

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
