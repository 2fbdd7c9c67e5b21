package tap

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// SetLinkLocal gives the TAP ll (an fe80::/64 address) as its only IPv6
// link-local address, in place of the one the kernel derives from the
// MAC: IPv6 address generation mode none, any other fe80:: address
// removed, ll added. IPoIB derives ib0's from the port GUID
// (ipoibcm.LinkLocal). The kernel flushes IPv6 addresses when a link goes
// down, so SetLinkUp(true) puts ll back, and so does Watch when the host
// sets the link up itself.
func (d *Device) SetLinkLocal(ll netip.Addr) error {
	if !ll.Is6() || !ll.IsLinkLocalUnicast() || ll.Zone() != "" {
		return fmt.Errorf("tap %s: link-local %v is not an fe80::/64 address", d.name, ll)
	}
	d.nlMu.Lock()
	defer d.nlMu.Unlock()
	if d.closed.Load() {
		return fmt.Errorf("tap %s: set link-local: %w", d.name, net.ErrClosed)
	}
	l, err := d.link()
	if err != nil {
		return err
	}
	if err := d.nl.LinkSetIP6AddrGenMode(l, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("tap %s: IPv6 address generation mode none: %w", d.name, err)
	}
	d.linkLocal = ll
	return d.applyLinkLocal(l)
}

// restoreLinkLocal puts the link-local back after the host set the link
// down and up (Watch).
func (d *Device) restoreLinkLocal() error {
	d.nlMu.Lock()
	defer d.nlMu.Unlock()
	if d.closed.Load() || !d.linkLocal.IsValid() {
		return nil
	}
	l, err := d.link()
	if err != nil {
		return err
	}
	return d.applyLinkLocal(l)
}

// applyLinkLocal makes d.linkLocal the link's only fe80:: address; nlMu
// held.
func (d *Device) applyLinkLocal(l netlink.Link) error {
	if !d.linkLocal.IsValid() {
		return nil
	}
	addrs, err := d.nl.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("tap %s: list addresses: %w", d.name, err)
	}
	have := false
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		switch {
		case !ok || !ip.IsLinkLocalUnicast():
		case ip == d.linkLocal:
			have = true
		default:
			if err := d.nl.AddrDel(l, &a); err != nil {
				return fmt.Errorf("tap %s: remove link-local %v: %w", d.name, ip, err)
			}
		}
	}
	if have {
		return nil
	}
	// No DAD, unlike Linux's addrconf on ib0: the address is the GID's
	// interface ID, and the GID is the address the fabric itself reaches
	// this host by, so a duplicate would already have broken far more than
	// the link-local. DAD would hold the address tentative (unbindable)
	// for a second after every link up. The kernel adds IFA_F_PERMANENT
	// itself for an address without a lifetime.
	a := &netlink.Addr{IPNet: prefixToIPNet(netip.PrefixFrom(d.linkLocal, 64)), Flags: unix.IFA_F_NODAD}
	if err := d.nl.AddrAdd(l, a); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("tap %s: add link-local %v: %w", d.name, d.linkLocal, err)
	}
	return nil
}
