package rocev2

import (
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// maxGSOPayload is the most UDP payload one GSO message may carry: the
// super-packet must still fit an IPv4 total length (65535 - 20 - 8).
const maxGSOPayload = 65535 - wire.IPv4HeaderLen - wire.UDPHeaderLen

// sender writes batches with sendmmsg; it is guarded by Device.txMu.
//
// With gso set, flush turns each run of datagrams to one destination of
// one size (the last may be shorter) into one message with a UDP_SEGMENT
// control message: the kernel builds one super-packet and cuts it (late,
// or not at all when the receiver takes GRO) instead of walking the stack
// once per datagram. Over IPv4 the kernel numbers the segments' IP IDs
// 0, 1, 2, ..., and the ICRC covers the ID, so flush rewrites segment j's
// ICRC for ID j (computed for ID 0 when queued).
//
// Datagrams leave from their QP's socket (its UDP source port): a
// message holds datagrams of one socket, and flush hands each run of
// messages that share a socket to one sendmmsg on it.
//
// A datagram is one buffer, or a zero-copy one (txPacket.payload): its
// headers, the payload where the work request holds it, then pad and
// ICRC, as three iovecs that the kernel gathers (and cuts at the GSO
// segment size, which each whole datagram is).
type sender struct {
	sock  *udpSocket // the fabric port's, for datagrams staged without one
	batch *mmsgBatch
	// iovs hold up to three iovecs per datagram; iovFirst[i] is datagram
	// i's first, iovFirst[pending] the number in use.
	iovs     []unix.Iovec
	iovFirst []int
	lens     []int        // per staged datagram: its bytes
	icrcs    [][]byte     // per staged datagram: its 4 ICRC bytes
	dsts     []netip.Addr // per staged datagram
	srcs     []*udpSocket // per staged datagram
	// msgSrc[m] is message m's socket; end is where the sendmmsg in
	// progress stops (the end of its socket's run).
	msgSrc []*udpSocket
	end    int
	// msgFirst[m] is message m's first datagram; msgFirst[msgs] is the
	// number staged.
	msgFirst []int
	pending  int // datagrams staged
	msgs     int // messages built from them
	off      int // first message the next sendmmsg offers
	// gso groups datagrams into GSO messages. It is off while faults are
	// injected: a duplicated datagram is one buffer staged twice and
	// could not carry two IDs' ICRCs.
	gso     bool
	shifts  wire.IDShiftCache
	writeFn func(fd uintptr) bool
}

func newSender(s *udpSocket, size int) *sender {
	w := &sender{sock: s, batch: newMmsgBatch(size), iovs: make([]unix.Iovec, 3*size), iovFirst: make([]int, size+1),
		lens: make([]int, size), icrcs: make([][]byte, size), dsts: make([]netip.Addr, size), srcs: make([]*udpSocket, size),
		msgSrc: make([]*udpSocket, size), msgFirst: make([]int, size+1)}
	w.writeFn = w.sendmmsg
	return w
}

// stage adds one datagram from src (nil: the fabric port) to the batch;
// it reports false when full.
func (w *sender) stage(buf []byte, to netip.Addr, src *udpSocket) bool {
	return w.stagePacket(&txPacket{buf: buf, to: to, src: src})
}

// stagePacket adds p to the batch; it reports false when full.
func (w *sender) stagePacket(p *txPacket) bool {
	i := w.pending
	if i == len(w.batch.hdrs) {
		return false
	}
	src := p.src
	if src == nil {
		src = w.sock
	}
	k := w.iovFirst[i]
	if p.payload == nil {
		k = setIov(w.iovs, k, p.buf)
	} else {
		k = setIov(w.iovs, k, p.buf[:p.split])
		k = setIov(w.iovs, k, p.payload)
		k = setIov(w.iovs, k, p.buf[p.split:])
	}
	w.iovFirst[i+1] = k
	w.lens[i] = len(p.buf) + len(p.payload)
	w.icrcs[i] = nil
	if len(p.buf) >= wire.ICRCLen {
		w.icrcs[i] = p.buf[len(p.buf)-wire.ICRCLen:]
	}
	w.dsts[i] = p.to
	w.srcs[i] = src
	w.pending++
	return true
}

// setIov points iovs[k] at b and returns the next index; an empty b
// takes no iovec.
func setIov(iovs []unix.Iovec, k int, b []byte) int {
	if len(b) == 0 {
		return k
	}
	iovs[k].Base = &b[0]
	iovs[k].SetLen(len(b))
	return k + 1
}

// runLen is how many datagrams from i can leave as one GSO message: same
// socket, same destination, same size, except that a shorter one ends the
// run.
func (w *sender) runLen(i int) int {
	seg := w.lens[i]
	total := seg
	j := i + 1
	for ; j < w.pending && j-i < wire.MaxGSOSegments; j++ {
		n := w.lens[j]
		if w.dsts[j] != w.dsts[i] || w.srcs[j] != w.srcs[i] || n > seg || n == 0 || total+n > maxGSOPayload {
			break
		}
		total += n
		if n < seg {
			j++
			break
		}
	}
	return j - i
}

// build turns the staged datagrams into messages.
func (w *sender) build() {
	b := w.batch
	m := 0
	for i := 0; i < w.pending; m++ {
		n := 1
		if w.gso && w.srcs[i].gso {
			n = w.runLen(i)
		}
		w.msgFirst[m] = i
		w.msgSrc[m] = w.srcs[i]
		h := &b.hdrs[m].Hdr
		h.Iov = &w.iovs[w.iovFirst[i]]
		h.SetIovlen(w.iovFirst[i+n] - w.iovFirst[i])
		b.setAddr(m, w.dsts[i], w.sock.port, w.sock.v6)
		if n == 1 {
			h.Control = nil
			h.SetControllen(0)
			i++
			continue
		}
		c := b.control(m)
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		ch.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(w.lens[i])
		h.Control = &c[0]
		h.SetControllen(unix.CmsgSpace(2))
		if !w.sock.v6 {
			for j := 1; j < n; j++ {
				wire.SetICRCIDTail(w.icrcs[i+j], w.lens[i+j], wire.IPv4HeaderLen, uint16(j), &w.shifts)
			}
		}
		i += n
	}
	w.msgFirst[m] = w.pending
	w.msgs = m
}

func (w *sender) sendmmsg(fd uintptr) bool {
	b := w.batch
	n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[w.off])), uintptr(w.end-w.off), unix.MSG_DONTWAIT, 0, 0)
	var done bool
	b.n, done, b.err = mmsgResult(n, errno)
	return done
}

// txFailures are the datagrams one flush could not send: refused as
// larger than the route carries (EMSGSIZE) and refused otherwise, with the
// first error of each kind for the log.
type txFailures struct {
	tooBig, other       uint64
	tooBigErr, otherErr error
}

// add counts n datagrams refused with err.
func (f *txFailures) add(n int, err error, ctr *counters) {
	ctr.txErrors.Add(uint64(n))
	if errors.Is(err, unix.EMSGSIZE) {
		ctr.txTooBig.Add(uint64(n))
		f.tooBig += uint64(n)
		if f.tooBigErr == nil {
			f.tooBigErr = err
		}
		return
	}
	f.other += uint64(n)
	if f.otherErr == nil {
		f.otherErr = err
	}
}

// flush sends every staged datagram, waiting for socket space as needed,
// and counts them in ctr. A message the kernel refuses (EMSGSIZE, a route
// error) is skipped and its datagrams counted as transmit errors, those
// refused as too big also as TxTooBig. A GSO message refused with EIO (no
// checksum offload on the route) turns GSO off for good. A socket that
// went away (its QPs were destroyed, or the device closed) fails its run
// of messages, counted as transmit errors, with an error wrapping
// net.ErrClosed.
func (w *sender) flush(ctr *counters) txFailures {
	defer w.reset()
	w.build()
	var f txFailures
	for w.off < w.msgs {
		src := w.msgSrc[w.off]
		if w.end <= w.off {
			for w.end = w.off + 1; w.end < w.msgs && w.msgSrc[w.end] == src; w.end++ {
			}
		}
		if err := src.raw.Write(w.writeFn); err != nil {
			f.add(w.msgFirst[w.end]-w.msgFirst[w.off], fmt.Errorf("rocev2: sendmmsg: %w", err), ctr)
			w.off = w.end
			continue
		}
		ctr.txBatches.Add(1)
		for m := w.off; m < w.off+w.batch.n; m++ {
			w.count(m, ctr)
		}
		w.off += w.batch.n
		if err := w.batch.err; err != nil {
			n := w.msgFirst[w.off+1] - w.msgFirst[w.off]
			gso := n > 1
			if gso && errors.Is(err, unix.EIO) {
				w.gso = false
			}
			f.add(n, fmt.Errorf("rocev2: sendmmsg (GSO %v): %w", gso, err), ctr)
			w.off++
		}
	}
	return f
}

// count adds message m's datagrams to the transmit counters.
func (w *sender) count(m int, ctr *counters) {
	lo, hi := w.msgFirst[m], w.msgFirst[m+1]
	if hi-lo > 1 {
		ctr.txGSOMessages.Add(1)
	}
	var bytes uint64
	for i := lo; i < hi; i++ {
		bytes += uint64(w.lens[i])
	}
	ctr.txPackets.Add(uint64(hi - lo))
	ctr.txBytes.Add(bytes)
}

// reset forgets the staged buffers so the batch pins no packet memory.
func (w *sender) reset() {
	for k := range w.iovFirst[w.pending] {
		w.iovs[k].Base = nil
	}
	for i := range w.pending {
		w.icrcs[i] = nil
		w.dsts[i] = netip.Addr{}
		w.srcs[i] = nil
	}
	clear(w.msgSrc[:w.msgs])
	w.pending, w.msgs, w.off, w.end = 0, 0, 0, 0
}
