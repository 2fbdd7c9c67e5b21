package rocev2

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// LoopbackConfig configures a Loopback.
type LoopbackConfig struct {
	// Devices is how many devices to open, 2..MaxLoopbackDevices.
	Devices int
	// IPv6 puts the devices on IPv6 addresses instead of IPv4 ones.
	IPv6 bool
	// Device is every device's configuration. Bind's port, if set, is the
	// fabric's port (else the kernel picks a free one); Bind's address,
	// Peers and Name are set per device, and Faults.Seed is mixed with
	// the device's index so the devices draw different faults.
	Device Config
}

// MaxLoopbackDevices bounds a Loopback: every device is a socket and two
// goroutines.
const MaxLoopbackDevices = 4096

// Loopback is a fabric of RoCEv2 devices in one process, each on its own
// loopback address and UDP socket, so the real transport (socket I/O,
// ICRC, go-back-N, RNR, UDP faults) runs between many hosts without
// root. Over IPv4 the devices take 127.42.0.1, 127.42.0.2, ...: all of
// 127/8 is local on Linux. Over IPv6 only ::1 is, so the devices take
// fd49:504f:4942::1, ::2, ... on the loopback of a private network
// namespace (loopback_linux.go), which needs CAP_SYS_ADMIN.
type Loopback struct {
	devs   []*Device
	closed bool
}

// NewLoopback opens cfg.Devices devices, all on one UDP port, each
// knowing every other as a multicast peer.
func NewLoopback(cfg LoopbackConfig) (*Loopback, error) {
	if cfg.Devices < 2 || cfg.Devices > MaxLoopbackDevices {
		return nil, fmt.Errorf("rocev2 loopback: %d devices (2..%d)", cfg.Devices, MaxLoopbackDevices)
	}
	addrs := make([]netip.Addr, cfg.Devices)
	for k := range addrs {
		addrs[k] = loopbackAddr(k, cfg.IPv6)
	}
	l := &Loopback{}
	open := func() error {
		port := cfg.Device.Bind.Port()
		if port == 0 {
			p, err := freePort(addrs[0])
			if err != nil {
				return err
			}
			port = p
		}
		for k, a := range addrs {
			dc := cfg.Device
			dc.Bind = netip.AddrPortFrom(a, port)
			dc.Peers = addrs
			dc.Faults.Seed = cfg.Device.Faults.Seed*0x9E3779B97F4A7C15 + uint64(k) + 1
			if dc.Name == "" {
				dc.Name = fmt.Sprintf("rocev2-lo%d", k)
			} else {
				dc.Name = fmt.Sprintf("%s%d", cfg.Device.Name, k)
			}
			d, err := New(dc)
			if err != nil {
				return fmt.Errorf("rocev2 loopback: device %d: %w", k, err)
			}
			l.devs = append(l.devs, d)
		}
		return nil
	}
	var err error
	if cfg.IPv6 {
		err = inPrivateNetns(addrs, open)
	} else {
		err = open()
	}
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// loopbackAddr is device k's address.
func loopbackAddr(k int, v6 bool) netip.Addr {
	n := k + 1
	if v6 {
		b := netip.MustParseAddr("fd49:504f:4942::").As16()
		b[13], b[14], b[15] = byte(n>>16), byte(n>>8), byte(n)
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{127, 42 + byte(n>>16), byte(n >> 8), byte(n)})
}

// freePort asks the kernel for a UDP port free on a, so a loopback fabric
// needs neither 4791 nor a guess.
func freePort(a netip.Addr) (uint16, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		return 0, fmt.Errorf("rocev2 loopback: find a free port on %v: %w", a, err)
	}
	port := c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	if err := c.Close(); err != nil {
		return 0, fmt.Errorf("rocev2 loopback: %w", err)
	}
	return port, nil
}

// Devices returns the devices, in index order; after Close they are
// still there to read the final counters of.
func (l *Loopback) Devices() []*Device { return l.devs }

// Close closes every device (stopping its goroutines and closing its
// socket); a second Close does nothing.
func (l *Loopback) Close() error {
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, d := range l.devs {
		if err := d.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
