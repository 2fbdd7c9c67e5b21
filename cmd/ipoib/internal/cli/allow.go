package cli

import (
	"fmt"
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
