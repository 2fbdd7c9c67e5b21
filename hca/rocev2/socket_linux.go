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

// udpSocket is the device's UDP socket with batched I/O done directly
// through recvmmsg/sendmmsg on the runtime's non-blocking descriptor:
// x/net's ReadBatch builds a *net.UDPAddr per datagram, which was most of
// the data path's allocations.
type udpSocket struct {
	conn *net.UDPConn
	raw  syscall.RawConn
	v6   bool
	port uint16
}

// openSocket binds an unconnected UDP socket with IP_PMTUDISC_DO, so the
// kernel sends IPv4 ID 0 with DF set and the ICRC computed before sendmmsg
// matches the wire.
func openSocket(bind netip.AddrPort) (*udpSocket, error) {
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
		return nil, fmt.Errorf("rocev2: set PMTU discovery on %v: %w", bind, err)
	}
	port := conn.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	return &udpSocket{conn: conn, raw: raw, v6: network == "udp6", port: port}, nil
}

func (s *udpSocket) Close() error { return s.conn.Close() }

// mmsgBatch is a reusable recvmmsg/sendmmsg vector: one header, one iovec
// and one socket address per datagram, all allocated once.
type mmsgBatch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	bufs  [][]byte
	// n and err are the last call's result; the callbacks given to the
	// RawConn write them so the callbacks themselves are built once.
	n   int
	err error
}

func newMmsgBatch(size int) *mmsgBatch {
	b := &mmsgBatch{
		hdrs:  make([]unix.Mmsghdr, size),
		iovs:  make([]unix.Iovec, size),
		names: make([]unix.RawSockaddrInet6, size),
		bufs:  make([][]byte, size),
	}
	for i := range b.hdrs {
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
		b.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	return b
}

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

// receiver reads batches with recvmmsg. It belongs to the receive
// goroutine.
type receiver struct {
	sock  *udpSocket
	batch *mmsgBatch
	// want is how many headers the next call offers.
	want   int
	readFn func(fd uintptr) bool
}

func newReceiver(s *udpSocket, size, bufSize int) *receiver {
	r := &receiver{sock: s, batch: newMmsgBatch(size), want: size}
	for i := range size {
		r.batch.setBuf(i, make([]byte, bufSize))
	}
	r.readFn = r.recvmmsg
	return r
}

// recvmmsg is the RawConn read callback: false asks the runtime to wait
// for readability.
func (r *receiver) recvmmsg(fd uintptr) bool {
	b := r.batch
	for i := range r.want {
		b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].Hdr.Flags = 0
		b.hdrs[i].Len = 0
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(r.want), unix.MSG_DONTWAIT, 0, 0)
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	b.n, b.err = int(n), nil
	if errno != 0 {
		b.n, b.err = 0, errno
	}
	return true
}

// read blocks until at least one datagram arrived and returns how many.
// Datagram i is r.datagram(i).
func (r *receiver) read() (int, error) {
	if err := r.sock.raw.Read(r.readFn); err != nil {
		return 0, fmt.Errorf("rocev2: recvmmsg: %w", err)
	}
	if r.batch.err != nil {
		return 0, fmt.Errorf("rocev2: recvmmsg: %w", r.batch.err)
	}
	return r.batch.n, nil
}

// datagram returns datagram i of the last read: its bytes, sender and
// whether the kernel cut it to the buffer.
func (r *receiver) datagram(i int) (b []byte, from netip.AddrPort, ok, truncated bool) {
	m := &r.batch.hdrs[i]
	from, ok = r.batch.addr(i)
	n := min(int(m.Len), len(r.batch.bufs[i]))
	return r.batch.bufs[i][:n], from, ok, m.Hdr.Flags&unix.MSG_TRUNC != 0
}

// sender writes batches with sendmmsg; it is guarded by Device.txMu.
type sender struct {
	sock    *udpSocket
	batch   *mmsgBatch
	pending int // datagrams staged
	off     int // first datagram the next sendmmsg offers
	writeFn func(fd uintptr) bool
}

func newSender(s *udpSocket, size int) *sender {
	w := &sender{sock: s, batch: newMmsgBatch(size)}
	w.writeFn = w.sendmmsg
	return w
}

// stage adds one datagram to the batch; it reports false when full.
func (w *sender) stage(buf []byte, to netip.Addr) bool {
	if w.pending == len(w.batch.hdrs) {
		return false
	}
	w.batch.setBuf(w.pending, buf)
	w.batch.setAddr(w.pending, to, w.sock.port, w.sock.v6)
	w.pending++
	return true
}

func (w *sender) sendmmsg(fd uintptr) bool {
	b := w.batch
	n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[w.off])), uintptr(w.pending-w.off), unix.MSG_DONTWAIT, 0, 0)
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	b.n, b.err = int(n), nil
	if errno != 0 {
		b.n, b.err = 0, errno
	}
	return true
}

// flush sends every staged datagram, waiting for socket space as needed,
// and counts them in ctr. A datagram the kernel refuses (EMSGSIZE, a
// route error) is skipped and counted as a transmit error; the first such
// error is returned for logging. The error wraps net.ErrClosed when the
// socket went away, and the rest of the batch is then discarded.
func (w *sender) flush(ctr *counters) error {
	defer w.reset()
	var first error
	for w.off < w.pending {
		if err := w.sock.raw.Write(w.writeFn); err != nil {
			return fmt.Errorf("rocev2: sendmmsg: %w", err)
		}
		ctr.txBatches.Add(1)
		for i := w.off; i < w.off+w.batch.n; i++ {
			ctr.txPackets.Add(1)
			ctr.txBytes.Add(uint64(len(w.batch.bufs[i])))
		}
		w.off += w.batch.n
		if w.batch.err != nil {
			ctr.txErrors.Add(1)
			if first == nil {
				first = fmt.Errorf("rocev2: sendmmsg: %w", w.batch.err)
			}
			w.off++
		}
	}
	return first
}

// reset forgets the staged buffers so the batch pins no packet memory.
func (w *sender) reset() {
	for i := range w.pending {
		w.batch.bufs[i] = nil
		w.batch.iovs[i].Base = nil
	}
	w.pending, w.off = 0, 0
}
