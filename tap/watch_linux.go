package tap

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// HostState is what the host has made of the TAP: `ip link set ib0 mtu
// X`, `ip link set ib0 down`, `ip addr add`, `ip link set ib0 address`.
type HostState struct {
	Up    bool // administratively up (IFF_UP)
	MTU   int
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
}

// Equal reports whether s and o describe the same state.
func (s HostState) Equal(o HostState) bool {
	return s.Up == o.Up && s.MTU == o.MTU && slices.Equal(s.MAC, o.MAC) && slices.Equal(s.Addrs, o.Addrs)
}

// Watch calls fn with the device's state now and after every link or
// address change the kernel reports for it (netlink RTM_NEWLINK and
// RTM_NEWADDR/DELADDR subscriptions in the device's namespace), until
// done closes. When the host sets the link up again, Watch first puts
// back the link-local address SetLinkLocal chose, as Linux's addrconf
// makes ib0's again on NETDEV_UP. fn runs on one goroutine, in order; the subscriptions'
// goroutines end once done is closed.
func (d *Device) Watch(done <-chan struct{}, fn func(HostState)) error {
	var ns *netns.NsHandle
	if d.ns != nil {
		h := d.ns.Handle()
		ns = &h
	}
	links := make(chan netlink.LinkUpdate, 16)
	addrs := make(chan netlink.AddrUpdate, 16)
	// Errors end a subscription (its channel closes); the state stops
	// following then, which the closed channel below notices.
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: ns, ErrorCallback: func(error) {}}); err != nil {
		return fmt.Errorf("tap %s: link subscribe: %w", d.name, err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{Namespace: ns, ErrorCallback: func(error) {}}); err != nil {
		return fmt.Errorf("tap %s: address subscribe: %w", d.name, err)
	}
	first, err := d.HostState()
	if err != nil {
		return err
	}
	fn(first)
	go func() {
		last := first
		for links != nil || addrs != nil {
			select {
			case u, ok := <-links:
				if !ok {
					links = nil
					continue
				}
				if int(u.Index) != d.index {
					continue
				}
			case u, ok := <-addrs:
				if !ok {
					addrs = nil
					continue
				}
				if u.LinkIndex != d.index {
					continue
				}
			}
			s, err := d.HostState()
			if err != nil || s.Equal(last) {
				continue // closed, or a change that does not concern us
			}
			if s.Up && !last.Up {
				// The host set ib0 up again after a down, which flushed
				// its IPv6 addresses; with address generation off the
				// kernel makes no link-local of its own.
				if err := d.restoreLinkLocal(); err == nil {
					s, _ = d.HostState()
				}
			}
			last = s
			fn(s)
		}
	}()
	return nil
}

// HostState reads the device's state from the kernel.
func (d *Device) HostState() (HostState, error) {
	d.nlMu.Lock()
	defer d.nlMu.Unlock()
	if d.closed.Load() {
		return HostState{}, fmt.Errorf("tap %s: state: %w", d.name, net.ErrClosed)
	}
	l, err := d.link()
	if err != nil {
		return HostState{}, err
	}
	list, err := d.nl.AddrList(l, unix.AF_UNSPEC)
	if err != nil {
		return HostState{}, fmt.Errorf("tap %s: addresses: %w", d.name, err)
	}
	a := l.Attrs()
	s := HostState{Up: a.Flags&net.FlagUp != 0, MTU: a.MTU, MAC: slices.Clone(a.HardwareAddr)}
	for _, ad := range list {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if !ok || ad.IPNet == nil {
			continue
		}
		ones, _ := ad.Mask.Size()
		s.Addrs = append(s.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
	}
	slices.SortFunc(s.Addrs, func(x, y netip.Prefix) int { return x.Addr().Compare(y.Addr()) })
	return s, nil
}
