package rocev2

import (
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// batchConn is the batched I/O both ipv4.PacketConn and ipv6.PacketConn
// provide (recvmmsg/sendmmsg on Linux).
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// socketBufferBytes asks for deep socket buffers: a window of RC packets
// from several QPs arrives in one burst.
const socketBufferBytes = 8 << 20

// openSocket binds an unconnected UDP socket with IP_PMTUDISC_DO, so the
// kernel sends IPv4 ID 0 with DF set and the ICRC computed before sendmmsg
// matches the wire.
func openSocket(bind netip.AddrPort) (*net.UDPConn, batchConn, error) {
	network := "udp4"
	if !bind.Addr().Is4() {
		network = "udp6"
	}
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(bind))
	if err != nil {
		return nil, nil, fmt.Errorf("rocev2: listen %v: %w", bind, err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("rocev2: raw conn: %w", err)
	}
	var sockErr error
	err = raw.Control(func(fd uintptr) {
		if network == "udp4" {
			sockErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		} else {
			sockErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		}
		if sockErr != nil {
			return
		}
		// FORCE variants need CAP_NET_ADMIN; the plain ones are capped by
		// rmem_max/wmem_max, which is still better than the default.
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], socketBufferBytes) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], socketBufferBytes)
			}
		}
	})
	if err == nil {
		err = sockErr
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("rocev2: set PMTU discovery on %v: %w", bind, err)
	}
	if network == "udp4" {
		return conn, ipv4.NewPacketConn(conn), nil
	}
	return conn, ipv6.NewPacketConn(conn), nil
}
