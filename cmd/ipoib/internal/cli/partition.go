package cli

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// 'ipoib fabric --partition 0x8001=1,2,3:limited' is the fabric playing
// the subnet manager's partition configuration (OpenSM's partitions.conf:
// a P_Key, its member ports, each full or limited): every member's P_Key
// table gets the partition, and every member an <ifname>.8001 child, so
// the lab comes up partitioned.

// partition is one --partition flag.
type partition struct {
	pkey    uint16 // with the full-membership bit
	members []partitionMember
}

type partitionMember struct {
	host    int // 1-based
	limited bool
}

// partitionsFlag collects repeated --partition flags.
type partitionsFlag struct{ parts []partition }

func (p *partitionsFlag) String() string {
	var s []string
	for _, pt := range p.parts {
		var m []string
		for _, x := range pt.members {
			v := strconv.Itoa(x.host)
			if x.limited {
				v += ":limited"
			}
			m = append(m, v)
		}
		s = append(s, fmt.Sprintf("0x%04x=%s", pt.pkey, strings.Join(m, ",")))
	}
	return strings.Join(s, " ")
}

// Set parses PKEY=MEMBER[,MEMBER...], MEMBER a host number with an
// optional :full (the default) or :limited.
func (p *partitionsFlag) Set(v string) error {
	pk, list, ok := strings.Cut(v, "=")
	if !ok || list == "" {
		return fmt.Errorf("want PKEY=HOSTS, e.g. 0x8001=1,2,3:limited")
	}
	k, msg := flagcheck.PKey("P_Key", pk)
	if msg != "" {
		return fmt.Errorf("%s", msg)
	}
	if k&0x8000 == 0 {
		return fmt.Errorf("P_Key 0x%04x: name the partition by its full P_Key (0x%04x) and mark limited members HOST:limited", k, k|0x8000)
	}
	for _, pt := range p.parts {
		if pt.pkey == k {
			return fmt.Errorf("partition 0x%04x given twice", k)
		}
	}
	pt := partition{pkey: k}
	seen := map[int]bool{}
	for _, m := range strings.Split(list, ",") {
		num, kind, _ := strings.Cut(strings.TrimSpace(m), ":")
		h, err := strconv.Atoi(num)
		if err != nil || h < 1 || h > maxHosts {
			return fmt.Errorf("member %q: want a host number 1..%d, optionally :full or :limited", m, maxHosts)
		}
		if seen[h] {
			return fmt.Errorf("host %d given twice", h)
		}
		seen[h] = true
		switch kind {
		case "", "full":
			pt.members = append(pt.members, partitionMember{host: h})
		case "limited":
			pt.members = append(pt.members, partitionMember{host: h, limited: true})
		default:
			return fmt.Errorf("member %q: membership %q, want full or limited", m, kind)
		}
	}
	p.parts = append(p.parts, pt)
	return nil
}

// check holds the partitions against the lab: hosts that exist, and a
// prefix for each partition after --prefix.
func (p *partitionsFlag) check(hosts int, base netip.Prefix) string {
	for _, pt := range p.parts {
		for _, m := range pt.members {
			if m.host > hosts {
				return fmt.Sprintf("--partition 0x%04x: host %d, but --hosts is %d", pt.pkey, m.host, hosts)
			}
		}
	}
	if _, err := partitionPrefix(base, len(p.parts)); err != nil {
		return "--partition: " + err.Error()
	}
	return ""
}

// partitionPrefix is the k-th prefix after base of base's length (k = 1:
// 10.77.1.0/24 after 10.77.0.0/24): the subnet of the k-th partition.
func partitionPrefix(base netip.Prefix, k int) (netip.Prefix, error) {
	base = base.Masked()
	b4 := base.Addr().As4()
	a := uint64(binary.BigEndian.Uint32(b4[:])) + uint64(k)<<(32-base.Bits())
	if a > 0xFFFFFFFF || base.Bits() == 0 {
		return netip.Prefix{}, fmt.Errorf("no room after --prefix %s for %d partition subnets", base, k)
	}
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], uint32(a))
	return netip.PrefixFrom(netip.AddrFrom4(out), base.Bits()), nil
}

// childRequests are the children pt makes: host number -> request, with
// host i at address i of the partition's subnet.
func (pt partition) childRequests(ifname string, subnet netip.Prefix) (map[int]control.ChildRequest, error) {
	addrs, err := hostAddrs(subnet, maxMember(pt))
	if err != nil {
		return nil, err
	}
	out := map[int]control.ChildRequest{}
	for _, m := range pt.members {
		entry := pt.pkey
		if m.limited {
			entry &^= 0x8000
		}
		out[m.host] = control.ChildRequest{PKey: entry, Name: childName(ifname, pt.pkey), Addrs: []string{addrs[m.host-1].String()}}
	}
	return out, nil
}

func maxMember(pt partition) int {
	n := 0
	for _, m := range pt.members {
		n = max(n, m.host)
	}
	return n
}
