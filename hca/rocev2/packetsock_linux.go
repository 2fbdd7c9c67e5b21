package rocev2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// packetSocket receives the device's IPv4 datagrams with their IP
// headers: an AF_PACKET socket on every interface of the namespace, whose classic BPF filter keeps
// UDP to the device's address and port addressed to this host. The
// IPv4 Identification is inside the ICRC, and a UDP socket never shows
// it (docs/wire.md §4.6). The UDP socket still owns the port, so the
// kernel answers no ICMP port unreachable; its receive is turned off
// (udpSocket.ignoreReceive).
//
// PACKET_VNET_HDR puts a virtio-net header in front of each packet: a
// UDP GSO super-packet (loopback and veth pass them whole) says there
// what its segment size is. That needs SOCK_RAW, so the link header
// stays; PACKET_AUXDATA says where the IP header starts.
type packetSocket struct {
	f   *os.File
	raw syscall.RawConn
	// drops accumulates PACKET_STATISTICS' tp_drops, which reading
	// resets.
	drops atomic.Uint64
}

// openIPv4Receive opens the packet socket an IPv4 device receives from
// and turns the UDP socket's receive off. It returns nil and no error
// for IPv6, for Config.UDPReceive, and where the packet socket is not
// to be had (no CAP_NET_RAW, no AF_PACKET): the UDP socket receives then,
// which the log says once.
func openIPv4Receive(sock *udpSocket, cfg Config) (*packetSocket, error) {
	if sock.v6 || cfg.UDPReceive {
		return nil, nil
	}
	ps, err := openPacketSocket(netip.AddrPortFrom(cfg.Bind.Addr(), sock.port))
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EAFNOSUPPORT) {
		cfg.Logger.Warn("rocev2: no packet socket: receiving through the UDP socket, which hides the IPv4 ID, so only IDs 0..63 pass the ICRC check and a Linux rxe peer's packets are dropped",
			"dev", cfg.Name, "err", err)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := sock.ignoreReceive(cfg.Bind.Addr().IsLoopback()); err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}

// socketDrops is the kernel's count of datagrams lost to a full receive
// buffer, of the socket the device receives from.
func (d *Device) socketDrops() (uint64, bool) {
	if d.psock != nil {
		return d.psock.readDrops()
	}
	return d.sock.drops()
}

// skfNetOff is SKF_NET_OFF (linux/filter.h) as an unsigned offset: a
// load from skfNetOff+k reads byte k of the network header, whatever
// link header (loopback's, Ethernet's, none) is in front of it.
const skfNetOff = 0xFFF00000

// packetRxFilter is the classic BPF program of the packet socket for
// UDP to addr:port: an IPv4 packet addressed to this host, no later
// fragment (it has no UDP header), destination port port. It returns the
// whole packet or nothing.
func packetRxFilter(addr netip.Addr, port uint16) ([]bpf.RawInstruction, error) {
	a := addr.As4()
	const accept = 0x40000
	dst := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	// A skip counts from the instruction after the jump; every test
	// jumps to the final "ret 0".
	prog := []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},                                     // 0
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.PACKET_HOST, SkipTrue: 10}, // 1
		bpf.LoadAbsolute{Off: skfNetOff + 9, Size: 1},                           // 2: protocol
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_UDP, SkipTrue: 8},  // 3
		bpf.LoadAbsolute{Off: skfNetOff + 16, Size: 4},                          // 4: destination
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: dst, SkipTrue: 6},               // 5
		bpf.LoadAbsolute{Off: skfNetOff + 6, Size: 2},                           // 6: flags, fragment offset
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1FFF, SkipTrue: 4},             // 7
		bpf.LoadMemShift{Off: skfNetOff},                                        // 8: X = IHL*4
		bpf.LoadIndirect{Off: skfNetOff + 2, Size: 2},                           // 9: UDP destination port
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(port), SkipTrue: 1},      // 10
		bpf.RetConstant{Val: accept},                                            // 11
		bpf.RetConstant{Val: 0},                                                 // 12
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("rocev2: assemble packet filter: %w", err)
	}
	return raw, nil
}

// attachFilter attaches a classic BPF program to fd.
func attachFilter(fd int, raw []bpf.RawInstruction) error {
	if len(raw) == 0 {
		return errors.New("rocev2: empty socket filter")
	}
	prog := unix.SockFprog{Len: uint16(len(raw)), Filter: (*unix.SockFilter)(unsafe.Pointer(&raw[0]))}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog)
}

// htons is for the protocol numbers of AF_PACKET, which are in network
// byte order.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// openPacketSocket opens the packet socket for datagrams to bind. The
// socket starts with protocol 0 (it receives nothing), gets its filter,
// and only then binds to ETH_P_IP, so no unfiltered packet is queued.
func openPacketSocket(bind netip.AddrPort) (*packetSocket, error) {
	if !bind.Addr().Is4() {
		return nil, fmt.Errorf("rocev2: packet socket for %v: IPv4 only: %w", bind, unix.EAFNOSUPPORT)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("rocev2: packet socket: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	filter, err := packetRxFilter(bind.Addr(), bind.Port())
	if err != nil {
		return nil, err
	}
	if err := attachFilter(fd, filter); err != nil {
		return nil, fmt.Errorf("rocev2: packet socket filter: %w", err)
	}
	for _, o := range []int{unix.PACKET_VNET_HDR, unix.PACKET_AUXDATA} {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, o, 1); err != nil {
			return nil, fmt.Errorf("rocev2: packet socket option %d: %w", o, err)
		}
	}
	// Our own transmits on loopback would show as PACKET_OUTGOING copies;
	// the filter drops them, and this (Linux 4.20) spares their clones.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	setBufferSizes(fd, false)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP)}); err != nil {
		return nil, fmt.Errorf("rocev2: bind packet socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), "rocev2-packet")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		ok = true // f owns fd now
		return nil, fmt.Errorf("rocev2: packet socket raw conn: %w", err)
	}
	ok = true
	return &packetSocket{f: f, raw: raw}, nil
}

func (s *packetSocket) Close() error { return s.f.Close() }

// readDrops adds the kernel's drops since the last reading (receive
// buffer full) and returns the total; false if the socket is closed.
func (s *packetSocket) readDrops() (uint64, bool) {
	var st unix.TpacketStats
	var gerr error
	err := s.raw.Control(func(fd uintptr) {
		var p *unix.TpacketStats
		p, gerr = unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
		if p != nil {
			st = *p
		}
	})
	if err != nil || gerr != nil {
		return s.drops.Load(), false
	}
	return s.drops.Add(uint64(st.Drops)), true
}

// ignoreReceive makes the UDP socket drop every datagram before it is
// queued (a filter that accepts nothing) and discards what was queued
// before: the packet socket receives them. The kernel counts each as a
// UDP receive error (sk_drops, UDP InErrors); the device reports the
// packet socket's drops instead.
//
// With keepGRO false UDP_GRO goes off: a NIC's GRO merges the datagrams
// of a flow into one packet only for a socket that asked for UDP_GRO,
// and a merged packet has one IP header, which hides the IDs after the
// first unless they run on by one. Loopback has no GRO, and there
// keeping UDP_GRO on spares the kernel segmenting each GSO super-packet
// only to drop the pieces (BenchmarkRC65524: docs/wire.md §4.6).
func (s *udpSocket) ignoreReceive(keepGRO bool) error {
	dropAll, err := bpf.Assemble([]bpf.Instruction{bpf.RetConstant{Val: 0}})
	if err != nil {
		return fmt.Errorf("rocev2: assemble drop filter: %w", err)
	}
	var serr error
	err = s.raw.Control(func(fd uintptr) {
		if s.gro && !keepGRO {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 0); serr != nil {
				return
			}
		}
		if serr = attachFilter(int(fd), dropAll); serr != nil {
			return
		}
		var buf [1]byte
		for {
			if _, _, e := unix.Recvfrom(int(fd), buf[:], unix.MSG_DONTWAIT|unix.MSG_TRUNC); e != nil {
				return // EAGAIN: empty
			}
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("rocev2: turn off UDP receive: %w", err)
	}
	s.gro = s.gro && keepGRO
	return nil
}

// queued is how many bytes wait in the UDP socket's receive queue
// (SO_MEMINFO's rmem_alloc); false if unknown.
func (s *udpSocket) queued() (uint32, bool) {
	info, ok := s.meminfo()
	return info[unix.SK_MEMINFO_RMEM_ALLOC], ok
}

// packetReceiver reads batches from the packet socket with recvmmsg:
// per message one buffer and room for the PACKET_AUXDATA control
// message. It belongs to the receive goroutine.
type packetReceiver struct {
	sock   *packetSocket
	hdrs   []unix.Mmsghdr
	iovs   []unix.Iovec
	bufs   [][]byte
	ctrl   []byte
	n      int
	err    error
	readFn func(fd uintptr) bool
	// Scratch of deliver: the frame, a GSO segment's headers, the
	// packet.
	frame  packetFrame
	segHdr [60 + wire.UDPHeaderLen]byte
	pkt    wire.Packet
}

// Packet socket buffers: a GSO super-packet is up to 64 KiB behind its
// virtio-net and link headers, and single datagrams come in longer runs;
// 16 such buffers are 1 MiB.
const (
	rxBatchPacket   = 16
	rxBufSizePacket = 1<<16 + 256
)

// sizeofAuxdata is the size of struct tpacket_auxdata.
const sizeofAuxdata = int(unsafe.Sizeof(unix.TpacketAuxdata{}))

// auxSpace is the control room per message: one tpacket_auxdata.
var auxSpace = unix.CmsgSpace(sizeofAuxdata)

func newPacketReceiver(s *packetSocket) *packetReceiver {
	// uint64 backing keeps every control message aligned for Cmsghdr.
	ctrl := make([]uint64, rxBatchPacket*auxSpace/8)
	r := &packetReceiver{
		sock: s,
		hdrs: make([]unix.Mmsghdr, rxBatchPacket),
		iovs: make([]unix.Iovec, rxBatchPacket),
		bufs: make([][]byte, rxBatchPacket),
		ctrl: unsafe.Slice((*byte)(unsafe.Pointer(&ctrl[0])), rxBatchPacket*auxSpace),
	}
	for i := range r.hdrs {
		r.bufs[i] = make([]byte, rxBufSizePacket)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(rxBufSizePacket)
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
	}
	r.readFn = r.recvmmsg
	return r
}

func (r *packetReceiver) recvmmsg(fd uintptr) bool {
	for i := range r.hdrs {
		h := &r.hdrs[i].Hdr
		h.Flags = 0
		h.Control = &r.ctrl[i*auxSpace]
		h.SetControllen(auxSpace)
		r.hdrs[i].Len = 0
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)), unix.MSG_DONTWAIT, 0, 0)
	var done bool
	r.n, done, r.err = mmsgResult(n, errno)
	return done
}

// read blocks until at least one packet arrived and returns how many.
func (r *packetReceiver) read() (int, error) {
	if err := r.sock.raw.Read(r.readFn); err != nil {
		return 0, fmt.Errorf("rocev2: packet socket recvmmsg: %w", err)
	}
	if r.err != nil {
		return 0, fmt.Errorf("rocev2: packet socket recvmmsg: %w", r.err)
	}
	return r.n, nil
}

// message returns message i of the last read, where its IP header starts
// behind the virtio-net header (-1 if the kernel did not say), and
// whether the kernel cut it to the buffer.
func (r *packetReceiver) message(i int) (b []byte, netOff int, truncated bool) {
	m := &r.hdrs[i]
	n := min(int(m.Len), len(r.bufs[i]))
	ctrl := r.ctrl[i*auxSpace : i*auxSpace+min(int(m.Hdr.Controllen), auxSpace)]
	return r.bufs[i][:n], auxNetOffset(ctrl), m.Hdr.Flags&unix.MSG_TRUNC != 0
}

// auxNetOffset finds the PACKET_AUXDATA control message and returns its
// tp_net, the offset of the network header in the packet; -1 if there is
// none or the buffer is malformed.
func auxNetOffset(ctrl []byte) int {
	if data := cmsgData(ctrl, unix.SOL_PACKET, unix.PACKET_AUXDATA); len(data) >= sizeofAuxdata {
		var aux unix.TpacketAuxdata
		return int(binary.NativeEndian.Uint16(data[unsafe.Offsetof(aux.Net):]))
	}
	return -1
}
