package rocev2

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"time"

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
	for _, a := range addrs {
		if err := awaitLocal(a); err != nil {
			return err
		}
	}
	return open()
}

// awaitLocal returns once a datagram sent to a reaches a socket bound to
// it. IPv6 installs a new address's local route from a work queue, after
// the netlink request returned, and until then datagrams to the address
// vanish (the first messages of a fresh fabric were lost one time in
// ten), so the address is tried rather than trusted.
func awaitLocal(a netip.Addr) error {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		return fmt.Errorf("rocev2 loopback: probe %v: %w", a, err)
	}
	defer c.Close()
	to := c.LocalAddr().(*net.UDPAddr)
	var buf [1]byte
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		_, _ = c.WriteToUDP([]byte{1}, to) // an unreachable address is retried
		if err := c.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
			return fmt.Errorf("rocev2 loopback: probe %v: %w", a, err)
		}
		if _, err := c.Read(buf[:]); err == nil {
			return nil
		}
	}
	return fmt.Errorf("rocev2 loopback: %v not reachable on lo after 5 s", a)
}
