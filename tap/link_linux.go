package tap

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultTxQueueLen sizes a TAP's (and the bench veths') transmit queue. A
// TAP gives the host stack no back-pressure, so the default of 1000
// overflows under a TCP burst while the reader is descheduled.
const DefaultTxQueueLen = 10000

// LinkConfig is what this package sets on a link through netlink.
type LinkConfig struct {
	// MTU is the IP MTU; 0 leaves the kernel's value.
	MTU int
	// TxQueueLen; 0 means DefaultTxQueueLen, negative leaves the kernel's.
	TxQueueLen int
	// Addrs are added to the link (IPv4 or IPv6 prefixes).
	Addrs []netip.Prefix
	// Up sets the link administratively up.
	Up bool
}

// configureLink applies cfg to link through h.
func configureLink(h *netlink.Handle, link netlink.Link, cfg LinkConfig) error {
	name := link.Attrs().Name
	qlen := cfg.TxQueueLen
	if qlen == 0 {
		qlen = DefaultTxQueueLen
	}
	if qlen > 0 {
		if err := h.LinkSetTxQLen(link, qlen); err != nil {
			return fmt.Errorf("%s: txqueuelen %d: %w", name, qlen, err)
		}
	}
	if cfg.MTU > 0 {
		if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("%s: mtu %d: %w", name, cfg.MTU, err)
		}
	}
	for _, p := range cfg.Addrs {
		a := &netlink.Addr{IPNet: prefixToIPNet(p)}
		if p.Addr().Is6() {
			// DAD would hold the address tentative for a second; these
			// links are private to the lab.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("%s: add %s: %w", name, p, err)
		}
	}
	if cfg.Up {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("%s: up: %w", name, err)
		}
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{
		IP:   p.Addr().AsSlice(),
		Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
	}
}

// ConfigureLink applies cfg to the named link inside the namespace.
func (n *Netns) ConfigureLink(name string, cfg LinkConfig) error {
	h, err := n.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netns %s: link %s: %w", n.name, name, err)
	}
	if err := configureLink(h, l, cfg); err != nil {
		return fmt.Errorf("netns %s: %w", n.name, err)
	}
	return nil
}

// CreateVethPair creates a veth pair with one end, nameA, in a and the
// other, nameB, in b, and applies cfgA and cfgB to them. The pair goes
// away with either namespace.
func CreateVethPair(a *Netns, nameA string, cfgA LinkConfig, b *Netns, nameB string, cfgB LinkConfig) error {
	h, err := a.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.NewLinkAttrs(),
		PeerName:      nameB,
		PeerNamespace: netlink.NsFd(int(b.Handle())),
	}
	veth.Name = nameA
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s/%s <-> %s/%s: %w", a.name, nameA, b.name, nameB, err)
	}
	if err := a.ConfigureLink(nameA, cfgA); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	if err := b.ConfigureLink(nameB, cfgB); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	return nil
}
