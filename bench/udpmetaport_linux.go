package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/offload"
	"github.com/ipoibcm/ipoib/tap"
)

// UDPMetaPort is the UDP half of the udp-pipe-offload baseline: a MetaPort
// whose frames, offload metadata included, cross a UDP socket with GSO and
// GRO. OffloadTapPipe joins it to a vnet-header TAP, so a 64 KiB TCP
// super frame with its partial checksum goes out as one or two sends and
// comes in as one or two receives, and reaches the far TAP as the near
// kernel left it: the most any userspace UDP encapsulation does with a
// frame (no segmentation, no checksum, no copy on either side).
//
// On the wire every UDP datagram is a segment of one frame: a
// udpSegHdrLen header (the frame's length, the segment's offset in it, the
// frame's virtio-net header) and then the bytes at that offset. Sends
// gather the headers and the frame's bytes with iovecs, and receives
// scatter them back: the headers into a small buffer, the bytes straight
// where they belong in the frame. Segments of one send all have the
// configured size but the last, so GSO cuts them and GRO puts them
// together at the same boundaries.
type UDPMetaPort struct {
	conn *net.UDPConn
	raw  syscall.RawConn
	caps offload.Caps
	// seg is the UDP payload of a full segment, chunk the frame bytes it
	// carries, perSend how many segments one send carries at most.
	seg, chunk, perSend int
	peer                unix.RawSockaddrInet4
	tx                  udpMetaTx
	rx                  udpMetaRx

	// Dropped counts received datagrams thrown away: malformed, out of
	// order, or cut short; the frames they belonged to are lost, as a
	// wire loses them. SendErrors counts segments the kernel refused.
	Dropped, SendErrors atomic.Uint64
}

// udpSegHdrLen is the header of each segment: frame length and offset
// (32 bits each, big-endian), the frame's virtio-net header, 2 bytes of
// padding.
const udpSegHdrLen = 8 + tap.VnetHdrLen + 2

// udpMetaSendSegs bounds the segments one WriteFramesMeta call stages
// before it writes them: a few 64 KiB frames' worth.
const udpMetaSendSegs = 256

// minUDPMetaSeg is the smallest segment size: a largest frame must fit
// the segments one flush stages.
const minUDPMetaSeg = udpSegHdrLen + (maxMetaFrame+udpMetaSendSegs-1)/udpMetaSendSegs

// udpMetaTx is the send state, owned by the one goroutine that writes.
type udpMetaTx struct {
	hdrs    []unix.Mmsghdr
	iovs    []unix.Iovec
	segHdrs []byte
	gsoCtrl []byte // one UDP_SEGMENT control message, shared by all sends
	msgs    int    // messages staged
	segs    int    // segments staged
	off     int    // first message not yet written
	err     error
	fn      func(fd uintptr) bool
}

// udpMetaRx is the receive state, owned by the one goroutine that reads.
type udpMetaRx struct {
	msg     unix.Msghdr
	iovs    []unix.Iovec
	segHdrs []byte
	ctrl    []byte
	n       int
	err     error
	fn      func(fd uintptr) bool
	// The frame being put together in the caller's buffer: its length,
	// how many of its bytes arrived, its virtio-net header.
	frameLen, have int
	vnet           [tap.VnetHdrLen]byte
}

// NewUDPMetaPort sends to peer through conn in segments of seg bytes of
// UDP payload (at most the path MTU minus the IP and UDP headers; both
// ends must use the same), and reports accept as what the far side takes
// (the far TAP's HostOffloads). It turns on UDP GRO; the port owns conn.
func NewUDPMetaPort(conn *net.UDPConn, peer netip.AddrPort, seg int, accept offload.Caps) (*UDPMetaPort, error) {
	if !peer.Addr().Is4() {
		return nil, fmt.Errorf("udp meta port: peer %v: IPv4 only", peer)
	}
	if seg < minUDPMetaSeg || seg > MaxUDPPipeFrame {
		return nil, fmt.Errorf("udp meta port: segment size %d not in %d..%d", seg, minUDPMetaSeg, MaxUDPPipeFrame)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("udp meta port: %w", err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1)
		if serr == nil {
			// A zero size probes for GSO without a socket-wide default.
			serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, 0)
		}
	}); err != nil || serr != nil {
		return nil, fmt.Errorf("udp meta port: UDP GSO/GRO: %w", errors.Join(err, serr))
	}
	p := &UDPMetaPort{conn: conn, raw: raw, caps: accept, seg: seg, chunk: seg - udpSegHdrLen,
		perSend: min(MaxUDPPipeFrame/seg, 64)}
	p.peer = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: peer.Addr().As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&p.peer.Port))[:], peer.Port())
	p.initTx()
	p.initRx()
	return p, nil
}

func (p *UDPMetaPort) initTx() {
	t := &p.tx
	t.hdrs = make([]unix.Mmsghdr, udpMetaSendSegs)
	t.iovs = make([]unix.Iovec, 2*udpMetaSendSegs)
	t.segHdrs = make([]byte, udpMetaSendSegs*udpSegHdrLen)
	ctrl := make([]uint64, (unix.CmsgSpace(2)+7)/8) // aligned for Cmsghdr
	t.gsoCtrl = unsafe.Slice((*byte)(unsafe.Pointer(&ctrl[0])), unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&t.gsoCtrl[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(t.gsoCtrl[unix.CmsgLen(0):], uint16(p.seg))
	t.fn = p.sendmmsg
}

func (p *UDPMetaPort) initRx() {
	r := &p.rx
	// A receive takes what GRO merged: up to 64 KiB of segments.
	n := 65535/p.seg + 1
	r.iovs = make([]unix.Iovec, 2*n)
	r.segHdrs = make([]byte, n*udpSegHdrLen)
	ctrl := make([]uint64, (unix.CmsgSpace(4)+7)/8)
	r.ctrl = unsafe.Slice((*byte)(unsafe.Pointer(&ctrl[0])), unix.CmsgSpace(4))
	r.msg.Iov = &r.iovs[0]
	r.fn = p.recvmsg
}

// BatchSize is 1: ReadFramesMeta returns one frame per call.
func (p *UDPMetaPort) BatchSize() int { return 1 }

// HostOffloads is what the far side takes, as given to NewUDPMetaPort.
func (p *UDPMetaPort) HostOffloads() offload.Caps { return p.caps }

// SetOffloads accepts whatever the near side hands over: the metadata
// crosses with the frame and the far TAP's kernel finishes it.
func (p *UDPMetaPort) SetOffloads(want offload.Caps) (offload.Caps, error) { return want, nil }

// Close closes the socket, which ends a blocked read.
func (p *UDPMetaPort) Close() error { return p.conn.Close() }

// WriteFramesMeta sends each frame with its metadata in segments; it
// returns how many frames the socket took whole, and stops at a closed
// socket. A segment the kernel refuses is counted (SendErrors) and its
// frame is lost, as a wire would lose it.
func (p *UDPMetaPort) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	t := &p.tx
	for i, f := range frames {
		if len(f) == 0 || len(f) > maxMetaFrame {
			return i, fmt.Errorf("udp meta port: frame of %d bytes: outside 1..%d", len(f), maxMetaFrame)
		}
		var m offload.Meta
		if i < len(meta) {
			m = meta[i]
		}
		if t.segs+(len(f)+p.chunk-1)/p.chunk > udpMetaSendSegs {
			if err := p.flush(); err != nil {
				return i, err
			}
		}
		p.stage(f, tap.VnetHdrFor(f, m))
	}
	if err := p.flush(); err != nil {
		return 0, err
	}
	return len(frames), nil
}

// stage lays out frame f as segments: per segment an iovec for its header
// and one for its bytes, perSend segments to a message.
func (p *UDPMetaPort) stage(f []byte, vh tap.VnetHdr) {
	t := &p.tx
	for off := 0; off < len(f); {
		m := &t.hdrs[t.msgs]
		t.msgs++
		first := t.segs
		for k := 0; k < p.perSend && off < len(f); k++ {
			n := min(p.chunk, len(f)-off)
			h := t.segHdrs[t.segs*udpSegHdrLen : (t.segs+1)*udpSegHdrLen]
			binary.BigEndian.PutUint32(h, uint32(len(f)))
			binary.BigEndian.PutUint32(h[4:], uint32(off))
			vh.Encode(h[8:])
			t.iovs[2*t.segs].Base, t.iovs[2*t.segs+1].Base = &h[0], &f[off]
			t.iovs[2*t.segs].SetLen(udpSegHdrLen)
			t.iovs[2*t.segs+1].SetLen(n)
			t.segs++
			off += n
		}
		*m = unix.Mmsghdr{}
		m.Hdr.Name = (*byte)(unsafe.Pointer(&p.peer))
		m.Hdr.Namelen = unix.SizeofSockaddrInet4
		m.Hdr.Iov = &t.iovs[2*first]
		m.Hdr.SetIovlen(2 * (t.segs - first))
		if t.segs-first > 1 {
			m.Hdr.Control = &t.gsoCtrl[0]
			m.Hdr.SetControllen(len(t.gsoCtrl))
		}
	}
}

// flush writes the staged messages.
func (p *UDPMetaPort) flush() error {
	t := &p.tx
	defer func() { t.msgs, t.segs, t.off = 0, 0, 0 }()
	for t.off < t.msgs {
		t.err = nil
		if err := p.raw.Write(t.fn); err != nil {
			return fmt.Errorf("udp meta port: sendmmsg: %w", err)
		}
		if t.err != nil {
			// The message at t.off was refused: count it, go on.
			p.SendErrors.Add(1)
			t.off++
		}
	}
	return nil
}

// sendmmsg is the RawConn write callback.
func (p *UDPMetaPort) sendmmsg(fd uintptr) bool {
	t := &p.tx
	n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&t.hdrs[t.off])), uintptr(t.msgs-t.off), 0, 0, 0)
	switch {
	case errno == unix.EAGAIN || errno == unix.EINTR:
		return false
	case errno != 0:
		t.err = errno
	default:
		t.off += int(n)
	}
	return true
}

// ReadFramesMeta blocks until one whole frame arrived in bufs[0] and
// returns 1, with its size and metadata. Datagrams that do not continue
// the frame in progress end it (counted in Dropped); a send that starts a
// new frame is moved to the front of the buffer (the one copy, only after
// a loss or reordering).
func (p *UDPMetaPort) ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	if len(bufs) == 0 || len(sizes) == 0 || len(meta) == 0 {
		return 0, nil
	}
	r := &p.rx
	buf := bufs[0]
	r.frameLen, r.have = 0, 0
	for {
		p.placeAt(buf, r.have)
		if err := p.raw.Read(r.fn); err != nil {
			return 0, fmt.Errorf("udp meta port: recvmsg: %w", err)
		}
		if r.err != nil {
			return 0, fmt.Errorf("udp meta port: recvmsg: %w", r.err)
		}
		if !p.accept(buf) {
			p.Dropped.Add(1)
			r.frameLen, r.have = 0, 0
			continue
		}
		if r.have == r.frameLen {
			h, ok := tap.DecodeVnetHdr(r.vnet[:])
			if !ok {
				p.Dropped.Add(1)
				r.frameLen, r.have = 0, 0
				continue
			}
			sizes[0], meta[0] = r.frameLen, h.Meta()
			return 1, nil
		}
	}
}

// placeAt points the receive iovecs at buf from offset at: segment k's
// header into the header buffer, its bytes at at + k*chunk.
func (p *UDPMetaPort) placeAt(buf []byte, at int) {
	r := &p.rx
	segs := len(r.iovs) / 2
	for k := range segs {
		r.iovs[2*k].Base = &r.segHdrs[k*udpSegHdrLen]
		r.iovs[2*k].SetLen(udpSegHdrLen)
		lo, hi := min(at+k*p.chunk, len(buf)), min(at+(k+1)*p.chunk, len(buf))
		if lo < hi {
			r.iovs[2*k+1].Base = &buf[lo]
		} else {
			r.iovs[2*k+1].Base = nil
		}
		r.iovs[2*k+1].SetLen(hi - lo)
	}
	r.msg.SetIovlen(len(r.iovs))
}

// recvmsg is the RawConn read callback.
func (p *UDPMetaPort) recvmsg(fd uintptr) bool {
	r := &p.rx
	r.msg.Flags = 0
	r.msg.Control = &r.ctrl[0]
	r.msg.SetControllen(len(r.ctrl))
	n, _, errno := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&r.msg)), unix.MSG_DONTWAIT)
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	r.n, r.err = int(n), nil
	if errno != 0 {
		r.n, r.err = 0, errno
	}
	return true
}

// groSize is the segment size of the UDP_GRO control message the last
// receive carried, 0 if none.
func (p *UDPMetaPort) groSize() int {
	r := &p.rx
	if int(r.msg.Controllen) < unix.CmsgLen(4) {
		return 0
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&r.ctrl[0]))
	if h.Level != unix.SOL_UDP || h.Type != unix.UDP_GRO {
		return 0
	}
	return int(binary.NativeEndian.Uint32(r.ctrl[unix.CmsgLen(0):]))
}

// accept checks the segments of the last receive, which landed at
// rx.have, and adds them to the frame in progress; false drops them and
// the frame.
func (p *UDPMetaPort) accept(buf []byte) bool {
	r := &p.rx
	n := r.n
	if n == 0 || r.msg.Flags&unix.MSG_TRUNC != 0 {
		return false
	}
	if g := p.groSize(); g != 0 && g != p.seg || g == 0 && n > p.seg {
		return false
	}
	segs := (n + p.seg - 1) / p.seg
	data := n - segs*udpSegHdrLen
	if n-(segs-1)*p.seg <= udpSegHdrLen {
		return false // a last segment without bytes
	}
	h0 := r.segHdrs[:udpSegHdrLen]
	frameLen, off0 := int(binary.BigEndian.Uint32(h0)), int(binary.BigEndian.Uint32(h0[4:]))
	if frameLen <= 0 || frameLen > len(buf) || off0+data > frameLen {
		return false
	}
	for k := 1; k < segs; k++ {
		h := r.segHdrs[k*udpSegHdrLen : (k+1)*udpSegHdrLen]
		if int(binary.BigEndian.Uint32(h)) != frameLen || int(binary.BigEndian.Uint32(h[4:])) != off0+k*p.chunk {
			return false
		}
	}
	switch {
	case off0 == r.have && (r.have == 0 || frameLen == r.frameLen):
		// In order, where it was placed.
	case off0 == 0:
		// A new frame while another was in progress: that one lost
		// segments. Move this one to the front.
		p.Dropped.Add(1)
		if r.have+data > len(buf) {
			return false // cut by the end of the buffer
		}
		copy(buf, buf[r.have:r.have+data])
		r.have = 0
	default:
		return false
	}
	if off0 == 0 {
		copy(r.vnet[:], h0[8:8+tap.VnetHdrLen])
	}
	r.frameLen = frameLen
	r.have += data
	return true
}
