package tap

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/offload"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// This file is the Device's ipoibcm.OffloadPort half: frames move with
// their offload metadata (offload.Meta) instead of being finished in
// software. A Device opened without Config.VnetHdr implements the same
// methods with no offloads at all, so a caller can treat every Device
// alike and learn from HostOffloads and SetOffloads what is in force.

// vnetIO is the scatter/gather state of the one reader and of the
// serialised writers: the virtio header goes in its own iovec in front of
// the caller's buffer (readv/writev), so frames are read into and written
// from the caller's memory without a copy. The callbacks are built once,
// so a call allocates nothing.
type vnetIO struct {
	rc syscall.RawConn

	// reader only
	rhdr   [VnetHdrLen]byte
	riov   [2]unix.Iovec
	rbufs  [][]byte
	rsizes []int
	rmeta  []offload.Meta
	rn     int
	rerr   error
	readFn func(fd uintptr) bool

	// writers, under vnet.txMu
	whdr    [VnetHdrLen]byte
	wiov    [2]unix.Iovec
	werr    error
	writeFn func(fd uintptr) bool
	// gathered writes: the virtio header's iovec and one per piece
	giov     []unix.Iovec
	gatherFn func(fd uintptr) bool
	joinBuf  []byte // a gathered frame joined for the other paths
}

// maxGatherIov is the most iovecs one writev takes (UIO_MAXIOV); a frame
// of more pieces is joined first.
const maxGatherIov = 1024

func (v *vnet) initIO(rc syscall.RawConn) {
	io := &v.io
	io.rc = rc
	io.riov[0] = unix.Iovec{Base: &io.rhdr[0]}
	io.riov[0].SetLen(VnetHdrLen)
	io.wiov[0] = unix.Iovec{Base: &io.whdr[0]}
	io.wiov[0].SetLen(VnetHdrLen)
	io.readFn = v.readBatch
	io.writeFn = v.writeOne
	io.gatherFn = v.writeGathered
}

// readBatch is the raw read callback: it reads frames until the batch is
// full or the queue is empty, and asks the poller to wait only when it
// has nothing yet. A frame whose header lies is counted and skipped.
func (v *vnet) readBatch(fd uintptr) bool {
	io := &v.io
	for io.rn < len(io.rbufs) {
		b := io.rbufs[io.rn]
		if len(b) == 0 {
			io.rerr = fmt.Errorf("read: empty buffer: %w", unix.EINVAL)
			return true
		}
		io.riov[1] = unix.Iovec{Base: &b[0]}
		io.riov[1].SetLen(len(b))
		r, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&io.riov[0])), 2)
		if e == unix.EINTR {
			continue
		}
		if e == unix.EAGAIN {
			return io.rn > 0
		}
		if e != 0 {
			io.rerr = e
			return true
		}
		n := int(r)
		h, ok := DecodeVnetHdr(io.rhdr[:min(n, VnetHdrLen)])
		if !ok {
			v.drops[VnetDropShort].Add(1)
			continue
		}
		size := n - VnetHdrLen
		if size >= len(b) {
			// Truncated to the buffer: the caller sees a full buffer and
			// drops it as oversize; the header cannot describe it.
			io.rsizes[io.rn], io.rmeta[io.rn] = len(b), offload.Meta{}
			io.rn++
			continue
		}
		if _, reason := h.Validate(b[:size]); reason != VnetOK {
			v.drops[reason].Add(1)
			continue
		}
		io.rsizes[io.rn], io.rmeta[io.rn] = size, h.Meta()
		io.rn++
	}
	return true
}

// writeOne is the raw write callback for the frame in wiov.
func (v *vnet) writeOne(fd uintptr) bool {
	return v.writev(fd, v.io.wiov[:])
}

// writeGathered is the raw write callback for the frame in giov.
func (v *vnet) writeGathered(fd uintptr) bool {
	return v.writev(fd, v.io.giov)
}

// writev writes iov (a virtio header and the frame) with one system call.
func (v *vnet) writev(fd uintptr, iov []unix.Iovec) bool {
	io := &v.io
	for {
		_, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			io.werr = nil
		default:
			io.werr = e
		}
		return true
	}
}

// Meta is the header in the engine's terms (offload.Meta), offsets
// unchanged: both count the Ethernet header.
func (h VnetHdr) Meta() offload.Meta {
	return offload.Meta{
		GSO:        offload.GSO(h.GSOType &^ GSOECN),
		ECN:        h.GSOType&GSOECN != 0,
		GSOSize:    h.GSOSize,
		NeedsCsum:  h.NeedsCsum(),
		CsumStart:  h.CsumStart,
		CsumOffset: h.CsumOffset,
		DataValid:  h.DataValid(),
	}
}

// VnetHdrFor is the virtio header that hands frame to the kernel with m:
// hdr_len is the frame's headers (the kernel only uses it as a hint for
// its linear part).
func VnetHdrFor(frame []byte, m offload.Meta) VnetHdr {
	var h VnetHdr
	if m.NeedsCsum {
		h.Flags |= VnetNeedsCsum
		h.CsumStart, h.CsumOffset = m.CsumStart, m.CsumOffset
	} else if m.DataValid {
		h.Flags |= VnetDataValid
	}
	if m.GSO != offload.GSONone {
		h.GSOType, h.GSOSize = GSOType(m.GSO), m.GSOSize
		if m.ECN {
			h.GSOType |= GSOECN
		}
		if hd, err := offload.Parse(frame, EthHdrLen); err == nil {
			h.HdrLen = uint16(hd.End)
		}
	}
	return h
}

// ReadFramesMeta reads up to len(bufs) frames, as many as are queued
// (blocking only for the first), each with its offload metadata: super
// frames and partial checksums come up as the host left them, after
// Validate. Buffers should hold vnetMaxFrame bytes to take a super frame
// whole; a frame filling its buffer was truncated. Without
// Config.VnetHdr it is ReadFrames with zero metadata.
func (d *Device) ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	k := min(len(bufs), len(sizes), len(meta))
	if k == 0 {
		return 0, nil
	}
	if d.vnet == nil {
		n, err := d.ReadFrames(bufs[:k], sizes[:k])
		clear(meta[:n])
		return n, err
	}
	io := &d.vnet.io
	io.rbufs, io.rsizes, io.rmeta, io.rn, io.rerr = bufs[:k], sizes, meta, 0, nil
	err := io.rc.Read(io.readFn)
	n := io.rn
	if err == nil {
		err = io.rerr
	}
	io.rbufs, io.rsizes, io.rmeta = nil, nil, nil
	if err != nil && n == 0 {
		return 0, d.ioErr("read", err)
	}
	return n, nil
}

// WriteFramesMeta writes each frame behind the virtio header of its
// metadata: the kernel segments GSO frames itself where it must and
// treats NeedsCsum as CHECKSUM_PARTIAL; a DataValid frame is rewritten in
// place into that form (partialForKernel). A frame whose
// metadata the host does not accept (HostOffloads) is finished in
// software first. It stops at the first error.
func (d *Device) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	if d.vnet == nil {
		return d.writeFramesPlainMeta(frames, meta)
	}
	v := d.vnet
	accept := d.HostOffloads()
	v.txMu.Lock()
	defer v.txMu.Unlock()
	for i, f := range frames {
		var m offload.Meta
		if i < len(meta) {
			m = meta[i]
		}
		if err := d.writeMetaLocked(f, m, accept); err != nil {
			return i, err
		}
	}
	return len(frames), nil
}

// writeMetaLocked is WriteFramesMeta for one frame (vnet.txMu).
func (d *Device) writeMetaLocked(f []byte, m offload.Meta, accept offload.Caps) error {
	if len(f) == 0 || len(f) > vnetMaxFrame {
		return fmt.Errorf("tap %s: write frame of %d bytes: outside 1..%d", d.name, len(f), vnetMaxFrame)
	}
	if !accept.Accepts(m) {
		return d.writeSegmentedLocked(f, m)
	}
	if !m.NeedsCsum && (m.DataValid || m.GSO != offload.GSONone) {
		m = partialForKernel(f, m)
	}
	return d.writeVnetLocked(f, VnetHdrFor(f, m))
}

// WriteFramesGather is WriteFramesMeta for frames in pieces, each frame
// the concatenation of its pieces in order (what gro.Coalescer.FlushVec
// emits: a super frame's headers, then each segment's payload where it
// was received). A frame the kernel takes as it is with a partial
// checksum (NeedsCsum, a TCP/UDP super frame or not) goes in one writev
// of its virtio header and its pieces, nothing copied: tun copies from
// the iovecs into its skb anyway. Any other frame, or one of more pieces
// than a writev takes, is joined in a scratch buffer and written as
// WriteFramesMeta writes it. It stops at the first error.
func (d *Device) WriteFramesGather(frames [][][]byte, meta []offload.Meta) (int, error) {
	if d.vnet == nil {
		for i, pieces := range frames {
			var m []offload.Meta
			if i < len(meta) {
				m = meta[i : i+1]
			}
			if n, err := d.writeFramesPlainMeta([][]byte{d.joinPlain(pieces)}, m); n != 1 {
				return i, err
			}
		}
		return len(frames), nil
	}
	v := d.vnet
	accept := d.HostOffloads()
	v.txMu.Lock()
	defer v.txMu.Unlock()
	for i, pieces := range frames {
		var m offload.Meta
		if i < len(meta) {
			m = meta[i]
		}
		var err error
		switch size := piecesLen(pieces); {
		case len(pieces) == 1:
			err = d.writeMetaLocked(pieces[0], m, accept)
		case size == 0 || size > vnetMaxFrame:
			err = fmt.Errorf("tap %s: write frame of %d bytes in %d pieces: outside 1..%d", d.name, size, len(pieces), vnetMaxFrame)
		case m.NeedsCsum && accept.Accepts(m) && len(pieces) < maxGatherIov:
			err = d.writeGatheredLocked(pieces, m)
		default:
			err = d.writeMetaLocked(d.joinLocked(pieces), m, accept)
		}
		if err != nil {
			return i, err
		}
	}
	return len(frames), nil
}

func piecesLen(pieces [][]byte) int {
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	return n
}

// joinLocked copies pieces into the writers' join buffer (vnet.txMu).
func (d *Device) joinLocked(pieces [][]byte) []byte {
	v := d.vnet
	if v.io.joinBuf == nil {
		v.io.joinBuf = make([]byte, vnetMaxFrame)
	}
	n := 0
	for _, p := range pieces {
		n += copy(v.io.joinBuf[n:], p)
	}
	return v.io.joinBuf[:n]
}

// joinPlain joins pieces for a TAP without the virtio header, which has
// no gathered path (a rare configuration: it allocates).
func (d *Device) joinPlain(pieces [][]byte) []byte {
	if len(pieces) == 1 {
		return pieces[0]
	}
	var f []byte
	for _, p := range pieces {
		f = append(f, p...)
	}
	return f
}

// writeGatheredLocked writes the frame made of pieces behind m's virtio
// header with one writev (vnet.txMu). m has a partial checksum, so the
// checksum fields are the kernel's to finish and nothing is rewritten.
func (d *Device) writeGatheredLocked(pieces [][]byte, m offload.Meta) error {
	io := &d.vnet.io
	h := VnetHdrFor(nil, m)
	if m.GSO != offload.GSONone {
		h.HdrLen = gatheredHdrLen(pieces[0], m)
	}
	h.Encode(io.whdr[:])
	if cap(io.giov) < len(pieces)+1 {
		io.giov = make([]unix.Iovec, 0, len(pieces)+1)
	}
	io.giov = append(io.giov[:0], unix.Iovec{Base: &io.whdr[0]})
	io.giov[0].SetLen(VnetHdrLen)
	for _, p := range pieces {
		if len(p) == 0 {
			continue
		}
		io.giov = append(io.giov, unix.Iovec{Base: &p[0]})
		io.giov[len(io.giov)-1].SetLen(len(p))
	}
	err := io.rc.Write(io.gatherFn)
	if err == nil {
		err = io.werr
	}
	clear(io.giov)
	if err != nil {
		return d.ioErr(fmt.Sprintf("write frame of %d pieces", len(pieces)), err)
	}
	return nil
}

// gatheredHdrLen is hdr_len (a hint for the kernel's linear part) for a
// GSO frame in pieces: the end of the TCP header at CsumStart when the
// first piece holds its data offset, of the UDP header, else the end of
// the checksum field, the least the kernel makes of it anyway
// (tun_vnet_hdr_get).
func gatheredHdrLen(p0 []byte, m offload.Meta) uint16 {
	l4 := int(m.CsumStart)
	end := l4 + int(m.CsumOffset) + 2
	switch m.GSO {
	case offload.GSOTCPv4, offload.GSOTCPv6:
		if l4+12 < len(p0) {
			end = max(end, l4+int(header.TCP(p0[l4:]).DataOffset()))
		}
	case offload.GSOUDPL4:
		end = max(end, l4+8)
	}
	return uint16(end)
}

// partialForKernel hands a verified checksum (DataValid) to the kernel in
// the only form its TAP write path trusts: tun ignores
// VIRTIO_NET_HDR_F_DATA_VALID, but takes NEEDS_CSUM as CHECKSUM_PARTIAL,
// which local delivery trusts and forwarding completes. The checksum
// field is rewritten to the pseudo-header seed (offload.SetPartial). A
// frame that does not parse goes with no claim: the kernel verifies it.
func partialForKernel(f []byte, m offload.Meta) offload.Meta {
	h, err := offload.SetPartial(f, EthHdrLen)
	if err != nil {
		return offload.Meta{}
	}
	m.NeedsCsum, m.DataValid = true, false
	m.CsumStart, m.CsumOffset = uint16(h.L4), uint16(h.CsumOffset())
	return m
}

// writeVnetLocked writes frame behind h with one writev (vnet.txMu).
func (d *Device) writeVnetLocked(f []byte, h VnetHdr) error {
	io := &d.vnet.io
	h.Encode(io.whdr[:])
	io.wiov[1] = unix.Iovec{Base: &f[0]}
	io.wiov[1].SetLen(len(f))
	err := io.rc.Write(io.writeFn)
	if err == nil {
		err = io.werr
	}
	io.wiov[1] = unix.Iovec{}
	if err != nil {
		return d.ioErr(fmt.Sprintf("write frame of %d bytes", len(f)), err)
	}
	return nil
}

// writeSegmentedLocked finishes in software a frame the kernel would not
// take as it is (a USO frame on a kernel without USO): each segment
// written with complete checksums (vnet.txMu).
func (d *Device) writeSegmentedLocked(f []byte, m offload.Meta) error {
	v := d.vnet
	if m.GSO == offload.GSONone {
		if m.NeedsCsum {
			offload.CompletePartial(f, int(m.CsumStart), int(m.CsumOffset))
		}
		return d.writeVnetLocked(f, VnetHdr{})
	}
	hd, err := offload.Parse(f, EthHdrLen)
	if err != nil || m.GSOSize == 0 {
		return fmt.Errorf("tap %s: write GSO frame of %d bytes: %v: %w", d.name, len(f), err, unix.EINVAL)
	}
	if v.segBuf == nil {
		v.segBuf = make([]byte, vnetMaxFrame)
	}
	for k := range hd.Segments(int(m.GSOSize)) {
		n, err := hd.SegmentInto(v.segBuf, f, int(m.GSOSize), k, true)
		if err != nil {
			return fmt.Errorf("tap %s: segment GSO frame: %w", d.name, err)
		}
		if err := d.writeVnetLocked(v.segBuf[:n], VnetHdr{}); err != nil {
			return err
		}
	}
	return nil
}

// writeFramesPlainMeta is WriteFramesMeta on a TAP without the virtio
// header: only complete frames can go, so partial checksums are
// completed here. GSO frames are refused: HostOffloads said none.
func (d *Device) writeFramesPlainMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	for i, f := range frames {
		if i < len(meta) {
			m := meta[i]
			if m.GSO != offload.GSONone {
				return i, fmt.Errorf("tap %s: write GSO frame: opened without VnetHdr: %w", d.name, errors.ErrUnsupported)
			}
			if m.NeedsCsum {
				if int(m.CsumStart)+int(m.CsumOffset)+2 > len(f) || m.CsumStart < EthHdrLen {
					return i, fmt.Errorf("tap %s: write frame: checksum at %d+%d outside %d bytes: %w", d.name, m.CsumStart, m.CsumOffset, len(f), unix.EINVAL)
				}
				offload.CompletePartial(f, int(m.CsumStart), int(m.CsumOffset))
			}
		}
		if n, err := d.WriteFrames(frames[i : i+1]); n != 1 {
			return i, err
		}
	}
	return len(frames), nil
}

// HostOffloads is what the kernel accepts from us on write: with the
// virtio header, partial checksums and TCP super frames always
// (virtio_net_hdr_to_skb), UDP super frames (USO) where the kernel knows
// them (Linux 6.2, probed at open); nothing without it.
func (d *Device) HostOffloads() offload.Caps {
	if d.vnet == nil {
		return offload.Caps{}
	}
	return offload.Caps{Csum: true, TSO4: true, TSO6: true, USO: d.vnet.usoKnown}
}

// SetOffloads sets what the host may hand us unfinished (TUNSETOFFLOAD):
// TSO needs checksum offload, so it is dropped without it; USO is dropped
// where the kernel does not know it. It returns what is in force.
func (d *Device) SetOffloads(want offload.Caps) (offload.Caps, error) {
	if d.vnet == nil {
		return offload.Caps{}, nil
	}
	v := d.vnet
	var o Offloads
	if want.Csum {
		o |= OffloadCsum
		if want.TSO4 {
			o |= OffloadTSO4
		}
		if want.TSO6 {
			o |= OffloadTSO6
		}
		if want.USO && v.usoKnown {
			o |= OffloadUSO4 | OffloadUSO6
		}
	}
	v.setMu.Lock()
	defer v.setMu.Unlock()
	var ierr error
	if err := v.io.rc.Control(func(fd uintptr) { ierr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, int(o)) }); err != nil {
		ierr = err
	}
	if ierr != nil {
		return capsOf(v.offloads.Load()), d.ioErr(fmt.Sprintf("tunsetoffload %v", o), ierr)
	}
	v.offloads.Store(uint32(o))
	// The kernel keeps one set per device, so every queue has it now.
	for _, q := range d.queues {
		q.vnet.offloads.Store(uint32(o))
	}
	return capsOf(uint32(o)), nil
}

func capsOf(o uint32) offload.Caps {
	f := Offloads(o)
	return offload.Caps{
		Csum: f&OffloadCsum != 0,
		TSO4: f&OffloadTSO4 != 0,
		TSO6: f&OffloadTSO6 != 0,
		USO:  f&(OffloadUSO4|OffloadUSO6) == OffloadUSO4|OffloadUSO6,
	}
}
