package rocev2

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// BindInterface finds the interface that holds addr: multicast joins and
// sends use it, as rxe uses its netdev. A loopback address such as
// 127.0.0.2 is held by no interface but lies in lo's 127.0.0.1/8.
func BindInterface(addr netip.Addr) (*net.Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("rocev2: interfaces: %w", err)
	}
	var inSubnet *net.Interface
	for i := range ifs {
		addrs, err := ifs[i].Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			if ip.Unmap() == addr {
				return &ifs[i], nil
			}
			if ones, _ := n.Mask.Size(); addr.IsLoopback() && inSubnet == nil && netip.PrefixFrom(ip.Unmap(), ones).Contains(addr) {
				inSubnet = &ifs[i]
			}
		}
	}
	if inSubnet != nil {
		return inSubnet, nil
	}
	return nil, fmt.Errorf("rocev2: no interface holds %v, so no multicast group can be joined on it", addr)
}

// setMulticastSend makes the socket send multicast out of ifindex with
// TTL (hop limit) 1 and loop a copy back to this host's members: other
// devices on the host that joined the group get it as they would from
// the network, and this device's own QPs get theirs through their group
// socket (once: there is no other self copy in multicast mode).
func setMulticastSend(fd int, v6 bool, ifindex int) error {
	if v6 {
		for _, o := range [][2]int{{unix.IPV6_MULTICAST_IF, ifindex}, {unix.IPV6_MULTICAST_HOPS, 1}, {unix.IPV6_MULTICAST_LOOP, 1}} {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, o[0], o[1]); err != nil {
				return fmt.Errorf("rocev2: multicast send option %d: %w", o[0], err)
			}
		}
		return nil
	}
	if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifindex)}); err != nil {
		return fmt.Errorf("rocev2: IP_MULTICAST_IF: %w", err)
	}
	for _, o := range [][2]int{{unix.IP_MULTICAST_TTL, 1}, {unix.IP_MULTICAST_LOOP, 1}} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, o[0], o[1]); err != nil {
			return fmt.Errorf("rocev2: multicast send option %d: %w", o[0], err)
		}
	}
	return nil
}

// setMulticastSend is setMulticastSend on an open socket.
func (s *udpSocket) setMulticastSend(ifi *net.Interface) error {
	var serr error
	err := s.raw.Control(func(fd uintptr) { serr = setMulticastSend(int(fd), s.v6, ifi.Index) })
	return errors.Join(err, serr)
}

// openGroupSocket opens a socket bound to group:port that has joined the
// group on ifi: the kernel then reports the membership (IGMP/MLD), the
// network forwards the group's datagrams to this host, and the socket
// receives only those (bound to the group, IP_MULTICAST_ALL off).
// SO_REUSEADDR lets other devices on the host bind and join the same
// group; each gets its own copy. Closing it leaves the group.
func openGroupSocket(group netip.Addr, port uint16, ifi *net.Interface) (*net.UDPConn, error) {
	// Bound by hand: the net package binds a multicast address as the
	// wildcard, which would collide with the device's own socket.
	fam, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(port), Addr: group.As16(), ZoneId: uint32(ifi.Index)})
	allLevel, allOpt := unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_ALL
	if group.Is4() {
		fam, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(port), Addr: group.As4()}
		allLevel, allOpt = unix.IPPROTO_IP, unix.IP_MULTICAST_ALL
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("rocev2: group socket %v: %w", group, err)
	}
	f := os.NewFile(uintptr(fd), "rocev2-group-"+group.String())
	defer f.Close() // FilePacketConn holds its own descriptor
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return nil, fmt.Errorf("rocev2: group socket %v: SO_REUSEADDR: %w", group, err)
	}
	if err := unix.SetsockoptInt(fd, allLevel, allOpt, 0); err != nil {
		return nil, fmt.Errorf("rocev2: group socket %v: multicast-all off: %w", group, err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		return nil, fmt.Errorf("rocev2: group socket: bind %v port %d: %w", group, port, err)
	}
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, fmt.Errorf("rocev2: group socket %v: %w", group, err)
	}
	conn := pc.(*net.UDPConn)
	if err := groupMembership(conn, group, ifi.Index, true); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// groupMembership joins or leaves group on ifindex (IP_ADD_MEMBERSHIP /
// IPV6_JOIN_GROUP and their drops).
func groupMembership(conn *net.UDPConn, group netip.Addr, ifindex int, join bool) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("rocev2: group %v: %w", group, err)
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if group.Is6() {
			opt := unix.IPV6_JOIN_GROUP
			if !join {
				opt = unix.IPV6_LEAVE_GROUP
			}
			serr = unix.SetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IPV6, opt, &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifindex)})
			return
		}
		opt := unix.IP_ADD_MEMBERSHIP
		if !join {
			opt = unix.IP_DROP_MEMBERSHIP
		}
		serr = unix.SetsockoptIPMreqn(int(fd), unix.IPPROTO_IP, opt, &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)})
	})
	if err = errors.Join(err, serr); err != nil {
		verb := "join"
		if !join {
			verb = "leave"
		}
		return fmt.Errorf("rocev2: %s group %v on interface %d: %w", verb, group, ifindex, err)
	}
	return nil
}
