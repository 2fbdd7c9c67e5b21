package rocev2

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	b.n, b.err = int(n), nil
	if errno != 0 {
		b.n, b.err = 0, errno
	}
	return true
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
		level := int32(binary.NativeEndian.Uint32(ctrl[levelOff:]))
		typ := int32(binary.NativeEndian.Uint32(ctrl[typeOff:]))
		if clen < hdrLen || clen > len(ctrl) {
			return 0
		}
		if level == unix.SOL_UDP && typ == unix.UDP_GRO && clen >= hdrLen+4 {
			return max(int(int32(binary.NativeEndian.Uint32(ctrl[hdrLen:]))), 0)
		}
		next := unix.CmsgSpace(clen - hdrLen)
		if next > len(ctrl) {
			return 0
		}
		ctrl = ctrl[next:]
	}
	return 0
}
