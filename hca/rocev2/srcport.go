package rocev2

import (
	"net"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// maxSourcePorts bounds the send sockets a device keeps open: beyond it
// QPs send from the fabric port (counted), instead of one file descriptor
// per connection without limit.
const maxSourcePorts = 256

// sourcePorts are a device's send-only UDP sockets, one per source port
// its QPs send from, as RoCEv2 HCAs spread QPs over ECMP paths: an RC QP
// from rdma_get_udp_sport of its QP pair (wire.UDPSourcePort), a UD or
// GSI QP from rxe's hash of its QPN (wire.QPSourcePort). The kernel takes
// a datagram's source port from the socket, so each port is a socket
// bound to it; nothing is read from them, peers always send to the
// fabric port. QPs sharing a port share its socket, which closes with the
// last of them. Guarded by Device.mu; the sender only writes to the
// sockets it is handed.
type sourcePorts struct {
	bind  netip.Addr
	gso   bool
	mcast *net.Interface // multicast sends leave here (nil: no multicast)
	main  *udpSocket     // the fabric port's socket, also the fallback
	socks map[uint16]*sourceSocket
}

type sourceSocket struct {
	sock *udpSocket
	refs int
}

func newSourcePorts(main *udpSocket, bind netip.Addr, mcast *net.Interface) *sourcePorts {
	return &sourcePorts{bind: bind, gso: main.gso, mcast: mcast, main: main, socks: make(map[uint16]*sourceSocket)}
}

// acquire returns the socket that sends from port, opening it on first
// use. A port that cannot be bound (another socket has it, often an
// ephemeral port of some client) or one past maxSourcePorts falls back to
// the fabric port and is counted: the packets still flow, on one path.
func (p *sourcePorts) acquire(port uint16, ctr *counters) *udpSocket {
	if port == p.main.port {
		return p.main
	}
	if e := p.socks[port]; e != nil {
		e.refs++
		return e.sock
	}
	if len(p.socks) >= maxSourcePorts {
		ctr.sourcePortFallbacks.Add(1)
		return p.main
	}
	s, err := openSocket(netip.AddrPortFrom(p.bind, port), offloads{gso: p.gso}, p.mcast)
	if err != nil {
		ctr.sourcePortFallbacks.Add(1)
		return p.main
	}
	p.socks[port] = &sourceSocket{sock: s, refs: 1}
	ctr.sourcePorts.Store(uint64(len(p.socks)))
	return s
}

// release drops one user of s and returns it after the last, for the
// caller to close once it has let go of Device.mu (Device.deferClose):
// closing waits for a write in progress on the socket, which must not
// stall the device. Nil while others still use it.
func (p *sourcePorts) release(s *udpSocket, ctr *counters) *udpSocket {
	if s == nil || s == p.main {
		return nil
	}
	e := p.socks[s.port]
	if e == nil || e.sock != s {
		return nil
	}
	if e.refs--; e.refs > 0 {
		return nil
	}
	delete(p.socks, s.port)
	ctr.sourcePorts.Store(uint64(len(p.socks)))
	return s
}

// takeAll forgets every source socket and returns them to be closed
// outside Device.mu (Device.Close).
func (p *sourcePorts) takeAll(ctr *counters) []*udpSocket {
	var all []*udpSocket
	for port, e := range p.socks {
		all = append(all, e.sock)
		delete(p.socks, port)
	}
	ctr.sourcePorts.Store(0)
	return all
}

// sourcePortOf is the port a QP sends from: an RC QP's from its QP pair
// (once RTR named the peer), a UD or GSI QP's from its QPN.
func sourcePortOf(q *qp) uint16 {
	if q.typ == hca.QPTypeRC {
		return wire.UDPSourcePort(uint32(q.qpn), uint32(q.destQPN))
	}
	return wire.QPSourcePort(uint32(q.qpn))
}
