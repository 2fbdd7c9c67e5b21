package rocev2

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// socketBufferBytes asks for deep socket buffers: a window of RC packets
// from several QPs arrives in one burst.
const socketBufferBytes = 8 << 20

// mmsgResult is a RawConn callback's reading of a non-blocking
// recvmmsg/sendmmsg: not done on EAGAIN or EINTR (the runtime waits for
// the descriptor and calls again), else the message count or the error.
func mmsgResult(n uintptr, errno unix.Errno) (count int, done bool, err error) {
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return 0, false, nil
	}
	if errno != 0 {
		return 0, true, errno
	}
	return int(n), true, nil
}

// udpSocket is the device's UDP socket with batched I/O done directly
// through recvmmsg/sendmmsg on the runtime's non-blocking descriptor:
// x/net's ReadBatch builds a *net.UDPAddr per datagram, which was most of
// the data path's allocations.
type udpSocket struct {
	conn *net.UDPConn
	raw  syscall.RawConn
	v6   bool
	port uint16
	// gso: the kernel takes UDP_SEGMENT, so equal-sized datagrams to one
	// destination leave as one message (one trip down the stack).
	gso bool
	// gro: UDP_GRO is on, so the kernel may hand back several datagrams
	// of one flow as one buffer, with their size in a control message.
	gro bool
}

// offloads selects the UDP segmentation offloads openSocket asks for.
type offloads struct {
	gso, gro bool
}

// openSocket binds an unconnected UDP socket with IP_PMTUDISC_DO, so the
// kernel sends IPv4 ID 0 with DF set and the ICRC computed before sendmmsg
// matches the wire. GSO and GRO are turned on where asked for and the
// kernel has them; their absence is not an error.
//
// With mcast set, multicast sends leave through that interface
// (setMulticastSend).
func openSocket(bind netip.AddrPort, want offloads, mcast *net.Interface) (*udpSocket, error) {
	network := "udp4"
	if !bind.Addr().Is4() {
		network = "udp6"
	}
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(bind))
	if err != nil {
		return nil, fmt.Errorf("rocev2: listen %v: %w", bind, err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rocev2: raw conn: %w", err)
	}
	var sockErr error
	var have offloads
	err = raw.Control(func(fd uintptr) {
		if network == "udp4" {
			sockErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		} else {
			sockErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		}
		if sockErr != nil {
			return
		}
		if mcast != nil {
			if sockErr = setMulticastSend(int(fd), network == "udp6", mcast.Index); sockErr != nil {
				return
			}
		}
		setBufferSizes(int(fd), true)
		// A zero segment size probes for UDP_SEGMENT without setting a
		// socket-wide default; each message carries its own size.
		have.gso = want.gso && unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, 0) == nil
		have.gro = want.gro && unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1) == nil
	})
	if err == nil {
		err = sockErr
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rocev2: set PMTU discovery on %v: %w", bind, err)
	}
	port := conn.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	return &udpSocket{conn: conn, raw: raw, v6: network == "udp6", port: port, gso: have.gso, gro: have.gro}, nil
}

func (s *udpSocket) Close() error { return s.conn.Close() }

// soMeminfo is SO_MEMINFO (asm-generic/socket.h, Linux 4.6), which
// x/sys does not name: the socket's memory counters, whose
// SK_MEMINFO_DROPS is sk_drops, the datagrams the kernel discarded
// because the receive buffer was full.
const soMeminfo = 55

// setBufferSizes asks for socketBufferBytes of receive buffer on fd and,
// with send, of send buffer. The FORCE variants need CAP_NET_ADMIN; the
// plain ones are capped by rmem_max/wmem_max, which is still better than
// the default.
func setBufferSizes(fd int, send bool) {
	opts := [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}}
	if !send {
		opts = opts[:1]
	}
	for _, o := range opts {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], socketBufferBytes) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], socketBufferBytes)
		}
	}
}

// meminfo reads the socket's SO_MEMINFO counters; false if the socket is
// closed or the kernel does not report them.
func (s *udpSocket) meminfo() (info [unix.SK_MEMINFO_VARS]uint32, ok bool) {
	var errno syscall.Errno
	err := s.raw.Control(func(fd uintptr) {
		l := uint32(unsafe.Sizeof(info))
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, soMeminfo,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
	})
	return info, err == nil && errno == 0
}

// drops reads sk_drops; false if the socket is closed or the kernel
// does not report it.
func (s *udpSocket) drops() (uint64, bool) {
	info, ok := s.meminfo()
	return uint64(info[unix.SK_MEMINFO_DROPS]), ok
}

// mmsgBatch is a reusable recvmmsg/sendmmsg vector: per message one
// header, one socket address and room for one control message; per
// datagram one iovec. All allocated once. Without GSO message i carries
// datagram i; with GSO a message carries a run of datagrams.
type mmsgBatch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	ctrl  []byte                  // cmsgSpace bytes per message, 8-aligned
	bufs  [][]byte
	// n and err are the last call's result; the callbacks given to the
	// RawConn write them so the callbacks themselves are built once.
	n   int
	err error
}

// cmsgSpace is the control room per message: one UDP_SEGMENT (uint16) or
// UDP_GRO (int) control message.
var cmsgSpace = unix.CmsgSpace(4)

func newMmsgBatch(size int) *mmsgBatch {
	// uint64 backing keeps every control message aligned for Cmsghdr.
	ctrl := make([]uint64, size*cmsgSpace/8)
	b := &mmsgBatch{
		hdrs:  make([]unix.Mmsghdr, size),
		iovs:  make([]unix.Iovec, size),
		names: make([]unix.RawSockaddrInet6, size),
		ctrl:  unsafe.Slice((*byte)(unsafe.Pointer(&ctrl[0])), size*cmsgSpace),
		bufs:  make([][]byte, size),
	}
	for i := range b.hdrs {
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
		b.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	return b
}

// control returns message i's control buffer.
func (b *mmsgBatch) control(i int) []byte { return b.ctrl[i*cmsgSpace : (i+1)*cmsgSpace] }

// setBuf points datagram i at buf.
func (b *mmsgBatch) setBuf(i int, buf []byte) {
	b.bufs[i] = buf
	if len(buf) > 0 {
		b.iovs[i].Base = &buf[0]
	} else {
		b.iovs[i].Base = nil
	}
	b.iovs[i].SetLen(len(buf))
}

// setAddr writes the destination of datagram i.
func (b *mmsgBatch) setAddr(i int, a netip.Addr, port uint16, v6 bool) {
	h := &b.hdrs[i].Hdr
	if !v6 {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&b.names[i]))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.Unmap().As4()}
		putPort(&sa.Port, port)
		h.Namelen = unix.SizeofSockaddrInet4
		return
	}
	sa := &b.names[i]
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
	putPort(&sa.Port, port)
	h.Namelen = unix.SizeofSockaddrInet6
}

// addr decodes the source address recvmmsg stored for datagram i.
func (b *mmsgBatch) addr(i int) (netip.AddrPort, bool) {
	h := &b.hdrs[i].Hdr
	sa := &b.names[i]
	switch {
	case sa.Family == unix.AF_INET && h.Namelen >= unix.SizeofSockaddrInet4:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), getPort(&s4.Port)), true
	case sa.Family == unix.AF_INET6 && h.Namelen >= unix.SizeofSockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), getPort(&sa.Port)), true
	}
	return netip.AddrPort{}, false
}

// putPort stores a port in network byte order.
func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

func getPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}
