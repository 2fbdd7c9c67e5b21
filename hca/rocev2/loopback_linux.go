package rocev2

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inPrivateNetns runs open on an OS thread moved into a new network
// namespace whose loopback is up and carries addrs. The sockets open
// creates belong to that namespace for their lifetime; the thread is
// never handed back to the scheduler (its goroutine exits locked, so the
// runtime ends it), and the namespace goes when the last socket closes.
// Nothing of the host's network configuration is touched.
func inPrivateNetns(addrs []netip.Addr, open func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- setUpNetns(addrs, open)
	}()
	return <-errc
}

func setUpNetns(addrs []netip.Addr, open func() error) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("rocev2 loopback: IPv6 needs a private network namespace for %d addresses (only ::1 is local otherwise), which needs CAP_SYS_ADMIN: %w", len(addrs), err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rocev2 loopback: netlink: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("rocev2 loopback: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("rocev2 loopback: lo up: %w", err)
	}
	for _, a := range addrs {
		na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(lo, na); err != nil {
			return fmt.Errorf("rocev2 loopback: add %v to lo: %w", a, err)
		}
	}
	return open()
}
