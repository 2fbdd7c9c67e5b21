package tap

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The host's own multicast memberships, as the kernel lists them per
// network namespace in /proc/net/igmp and /proc/net/igmp6 (what `ip maddr`
// prints). These are the IP groups sockets joined on the device, which the
// device's link-layer list (/proc/net/dev_mcast) cannot give back: an
// Ethernet multicast MAC keeps 23 bits of an IPv4 group and 32 of an IPv6
// one.

// parseProcIGMP returns the IPv4 groups /proc/net/igmp lists for the
// device with index ifindex. The file has a header, then per device a
// line "<index>\t<name>: <count> <querier>" followed by one tab-indented
// line per group whose first field is the kernel's __be32 printed with
// %08X, that is in host byte order.
func parseProcIGMP(b []byte, ifindex int) ([]netip.Addr, error) {
	var groups []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(b))
	first, ours := true, false
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			continue // header
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			idx, err := strconv.Atoi(f[0])
			if err != nil {
				return nil, fmt.Errorf("igmp: device line %q: %w", line, err)
			}
			ours = idx == ifindex
			continue
		}
		if !ours {
			continue
		}
		v, err := strconv.ParseUint(f[0], 16, 32)
		if err != nil || len(f[0]) != 8 {
			return nil, fmt.Errorf("igmp: group line %q: not 8 hex digits", line)
		}
		var a [4]byte
		binary.NativeEndian.PutUint32(a[:], uint32(v))
		g := netip.AddrFrom4(a)
		if !g.IsMulticast() {
			return nil, fmt.Errorf("igmp: group line %q: %v is not multicast", line, g)
		}
		groups = append(groups, g)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("igmp: %w", err)
	}
	return groups, nil
}

// parseProcIGMP6 returns the IPv6 groups /proc/net/igmp6 lists for the
// device with index ifindex: one line per group, "<index> <name> <group as
// 32 hex digits> <users> <flags> <timer>".
func parseProcIGMP6(b []byte, ifindex int) ([]netip.Addr, error) {
	var groups []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 3 {
			return nil, fmt.Errorf("igmp6: line %q: want index, name, group", sc.Text())
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("igmp6: line %q: %w", sc.Text(), err)
		}
		if idx != ifindex {
			continue
		}
		var a [16]byte
		if len(f[2]) != 32 {
			return nil, fmt.Errorf("igmp6: line %q: group not 32 hex digits", sc.Text())
		}
		if _, err := hex.Decode(a[:], []byte(f[2])); err != nil {
			return nil, fmt.Errorf("igmp6: line %q: %w", sc.Text(), err)
		}
		g := netip.AddrFrom16(a)
		if !g.IsMulticast() {
			return nil, fmt.Errorf("igmp6: line %q: %v is not multicast", sc.Text(), g)
		}
		groups = append(groups, g)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("igmp6: %w", err)
	}
	return groups, nil
}
