package rocev2

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// rxBatch is how many datagrams one recvmmsg may return.
const rxBatch = 64

// rxBufSize leaves room beyond the largest valid packet so that an
// oversized datagram shows as too long rather than silently cut.
const rxBufSize = 8192

// With GRO a message holds up to 64 KiB of coalesced datagrams, so the
// buffers are that large and fewer: 512 KiB in all (8 and 32 measured
// the same; the smaller set stays in cache).
const (
	rxBatchGRO   = 8
	rxBufSizeGRO = 1 << 16
)

// receiver reads the UDP socket's batches with recvmmsg: the rxSource
// of a device that receives through its UDP socket.
type receiver struct {
	sock  *udpSocket
	batch *mmsgBatch
	// want is how many headers the next call offers.
	want   int
	readFn func(fd uintptr) bool
	pkt    wire.Packet
}

// newUDPReceiver sizes the batch for s: fewer, larger buffers with GRO.
func newUDPReceiver(s *udpSocket) *receiver {
	if s.gro {
		return newReceiver(s, rxBatchGRO, rxBufSizeGRO)
	}
	return newReceiver(s, rxBatch, rxBufSize)
}

func newReceiver(s *udpSocket, size, bufSize int) *receiver {
	r := &receiver{sock: s, batch: newMmsgBatch(size), want: size}
	for i := range size {
		r.batch.setBuf(i, make([]byte, bufSize))
	}
	r.readFn = r.recvmmsg
	return r
}

// deliver implements rxSource.
func (r *receiver) deliver(d *Device, i int) {
	b, from, seg, ok, truncated := r.message(i)
	switch {
	case !ok:
		d.ctr.rxPackets.Add(1)
		d.ctr.drop(wire.DropGarbage)
	case truncated:
		d.ctr.rxPackets.Add(1)
		d.ctr.drop(wire.DropTruncated)
		d.warnOversize(from, len(b))
	default:
		d.receiveMessage(b, from, seg, &r.pkt)
	}
}

// recvmmsg is the RawConn read callback: false asks the runtime to wait
// for readability.
func (r *receiver) recvmmsg(fd uintptr) bool {
	b := r.batch
	for i := range r.want {
		h := &b.hdrs[i].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.Flags = 0
		b.hdrs[i].Len = 0
		if r.sock.gro {
			h.Control = &b.ctrl[i*cmsgSpace]
			h.SetControllen(cmsgSpace)
		}
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(r.want), unix.MSG_DONTWAIT, 0, 0)
	var done bool
	b.n, done, b.err = mmsgResult(n, errno)
	return done
}

// read blocks until at least one message arrived and returns how many.
// Message i is r.message(i).
func (r *receiver) read() (int, error) {
	if err := r.sock.raw.Read(r.readFn); err != nil {
		return 0, fmt.Errorf("rocev2: recvmmsg: %w", err)
	}
	if r.batch.err != nil {
		return 0, fmt.Errorf("rocev2: recvmmsg: %w", r.batch.err)
	}
	return r.batch.n, nil
}

// message returns message i of the last read: its bytes, sender, the
// GRO segment size (0 when the message is one datagram) and whether the
// kernel cut it to the buffer.
func (r *receiver) message(i int) (b []byte, from netip.AddrPort, segSize int, ok, truncated bool) {
	m := &r.batch.hdrs[i]
	from, ok = r.batch.addr(i)
	n := min(int(m.Len), len(r.batch.bufs[i]))
	if r.sock.gro {
		segSize = groSegmentSize(r.batch.control(i)[:min(int(m.Hdr.Controllen), cmsgSpace)])
	}
	return r.batch.bufs[i][:n], from, segSize, ok, m.Hdr.Flags&unix.MSG_TRUNC != 0
}

// groSegmentSize finds the UDP_GRO control message in a recvmsg control
// buffer and returns the segment size it carries; 0 if there is none or
// the buffer is malformed.
func groSegmentSize(ctrl []byte) int {
	if data := cmsgData(ctrl, unix.SOL_UDP, unix.UDP_GRO); len(data) >= 4 {
		return max(int(int32(binary.NativeEndian.Uint32(data))), 0)
	}
	return 0
}

// cmsgData returns the data of the first control message of level and
// typ in a recvmsg control buffer; nil if there is none or the buffer is
// malformed. Unlike unix.ParseSocketControlMessage it allocates nothing:
// the receive path calls it for every message.
func cmsgData(ctrl []byte, level, typ int32) []byte {
	var h unix.Cmsghdr
	hdrLen := unix.CmsgLen(0)
	levelOff, typeOff := int(unsafe.Offsetof(h.Level)), int(unsafe.Offsetof(h.Type))
	for len(ctrl) >= hdrLen {
		// Decoded field by field: the buffer need not be aligned.
		var clen int
		if unsafe.Sizeof(h.Len) == 8 {
			clen = int(min(binary.NativeEndian.Uint64(ctrl), uint64(len(ctrl)+1)))
		} else {
			clen = int(binary.NativeEndian.Uint32(ctrl))
		}
		if clen < hdrLen || clen > len(ctrl) {
			return nil
		}
		if int32(binary.NativeEndian.Uint32(ctrl[levelOff:])) == level && int32(binary.NativeEndian.Uint32(ctrl[typeOff:])) == typ {
			return ctrl[hdrLen:clen]
		}
		next := unix.CmsgSpace(clen - hdrLen)
		if next > len(ctrl) {
			return nil
		}
		ctrl = ctrl[next:]
	}
	return nil
}
