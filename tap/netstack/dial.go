package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
)

// DialTCP opens a TCP connection from the host to addr (IPv4 or IPv6; an
// IPv6 link-local address needs no zone, the host has one NIC).
func (h *Host) DialTCP(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	fa, proto := toFullAddress(addr)
	c, err := gonet.DialContextTCP(ctx, h.stack, fa, proto)
	if err != nil {
		return nil, fmt.Errorf("netstack dial tcp %v: %w", addr, err)
	}
	return c, nil
}

// ListenTCP listens on port for both IPv4 and IPv6: the endpoint is an IPv6
// one bound to the unspecified address without V6ONLY, which gVisor, like
// Linux, makes dual-stack.
func (h *Host) ListenTCP(port uint16) (net.Listener, error) {
	l, err := gonet.ListenTCP(h.stack, tcpip.FullAddress{NIC: nicID, Port: port}, ipv6.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("netstack listen tcp port %d: %w", port, err)
	}
	return l, nil
}

// ListenUDP opens a UDP socket bound to laddr. An unspecified address of
// either family binds that family's wildcard, which also receives multicast
// for groups joined with JoinMulticast.
func (h *Host) ListenUDP(laddr netip.AddrPort) (*gonet.UDPConn, error) {
	fa, proto := toFullAddress(laddr)
	c, err := gonet.DialUDP(h.stack, &fa, nil, proto)
	if err != nil {
		return nil, fmt.Errorf("netstack listen udp %v: %w", laddr, err)
	}
	return c, nil
}

// DialUDP opens a UDP socket connected to raddr, from an ephemeral port.
func (h *Host) DialUDP(raddr netip.AddrPort) (*gonet.UDPConn, error) {
	fa, proto := toFullAddress(raddr)
	c, err := gonet.DialUDP(h.stack, nil, &fa, proto)
	if err != nil {
		return nil, fmt.Errorf("netstack dial udp %v: %w", raddr, err)
	}
	return c, nil
}

// JoinMulticast makes the NIC accept group and announce it: IGMP for IPv4,
// MLD for IPv6, which is what the engine listens for to join the matching
// InfiniBand multicast group.
func (h *Host) JoinMulticast(group netip.Addr) error {
	proto, addr, err := multicastGroup(group)
	if err != nil {
		return fmt.Errorf("netstack join: %w", err)
	}
	return tcpipErr(fmt.Sprintf("netstack join %v", group), h.stack.JoinGroup(proto, nicID, addr))
}

// LeaveMulticast undoes JoinMulticast.
func (h *Host) LeaveMulticast(group netip.Addr) error {
	proto, addr, err := multicastGroup(group)
	if err != nil {
		return fmt.Errorf("netstack leave: %w", err)
	}
	return tcpipErr(fmt.Sprintf("netstack leave %v", group), h.stack.LeaveGroup(proto, nicID, addr))
}

func multicastGroup(group netip.Addr) (tcpip.NetworkProtocolNumber, tcpip.Address, error) {
	group = group.Unmap().WithZone("")
	if !group.IsMulticast() {
		return 0, tcpip.Address{}, fmt.Errorf("%v is not a multicast address", group)
	}
	addr := tcpip.AddrFromSlice(group.AsSlice())
	if group.Is4() {
		return ipv4.ProtocolNumber, addr, nil
	}
	return ipv6.ProtocolNumber, addr, nil
}
