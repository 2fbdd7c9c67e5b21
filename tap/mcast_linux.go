package tap

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
)

// MulticastGroups is the host's multicast memberships on the device, as
// `ip maddr show dev` lists them: the IP groups sockets in its namespace
// joined on it and the kernel's own (all-hosts, all-nodes, solicited-node),
// from /proc/net/igmp and /proc/net/igmp6 of the device's namespace,
// sorted. This is the list Linux IPoIB syncs its joins to (the netdev's
// multicast list); a namespace without IPv6 has no igmp6 file, and the
// list is then IPv4 only.
func (d *Device) MulticastGroups() ([]netip.Addr, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("tap %s: multicast groups: %w", d.name, net.ErrClosed)
	}
	var v4, v6 []byte
	read := func() error {
		// thread-self: /proc/net is the process's namespace, the
		// locked thread is in the device's.
		var err error
		if v4, err = os.ReadFile("/proc/thread-self/net/igmp"); err != nil {
			return err
		}
		if v6, err = os.ReadFile("/proc/thread-self/net/igmp6"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	var err error
	if d.ns != nil {
		err = d.ns.Do(read)
	} else {
		err = onLockedThread(read)
	}
	if err != nil {
		return nil, fmt.Errorf("tap %s: multicast groups: %w", d.name, err)
	}
	groups, err := parseProcIGMP(v4, d.index)
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", d.name, err)
	}
	g6, err := parseProcIGMP6(v6, d.index)
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", d.name, err)
	}
	groups = append(groups, g6...)
	slices.SortFunc(groups, netip.Addr.Compare)
	return slices.Compact(groups), nil
}
