package tap

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// announceSysctls make the host kernel tell ib0's peers its addresses
// whenever ib0 comes up (NETDEV_UP) or changes its MAC: arp_notify sends a
// gratuitous ARP for each IPv4 address, ndisc_notify an unsolicited
// neighbour advertisement to all-nodes for each IPv6 address as it becomes
// usable (DAD done or skipped). Both are off by default in Linux.
//
// They are what makes a restarted peer reachable at once: it comes back
// with a new UD QPN, its engine raises the link only once the broadcast
// group is joined (HostPort.SetLinkUp), so the announcements leave as UD
// broadcasts, and every peer engine learns the new hardware address from
// them and replaces its connection to the old QP (docs/linux.md, "A
// restarted peer"). Without them a peer keeps sending on the dead
// connection until the RC transport gives up.
var announceSysctls = []string{
	"ipv4/conf/%s/arp_notify",
	"ipv6/conf/%s/ndisc_notify",
}

// enableAnnounce sets announceSysctls for the device, inside its namespace
// (/proc/sys/net is the opener's namespace). A host without IPv6 has no
// ipv6 directory: that sysctl is skipped.
func (d *Device) enableAnnounce() error {
	set := func() error {
		for _, f := range announceSysctls {
			p := filepath.Join("/proc/sys/net", fmt.Sprintf(f, d.name))
			if err := os.WriteFile(p, []byte("1\n"), 0); err != nil {
				if os.IsNotExist(err) && strings.HasPrefix(f, "ipv6/") {
					continue
				}
				return fmt.Errorf("sysctl %s: %w", p, err)
			}
		}
		return nil
	}
	if d.ns != nil {
		return d.ns.Do(set)
	}
	return set()
}
