package tap

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/offload"
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
}

func (v *vnet) initIO(rc syscall.RawConn) {
	io := &v.io
	io.rc = rc
	io.riov[0] = unix.Iovec{Base: &io.rhdr[0]}
	io.riov[0].SetLen(VnetHdrLen)
	io.wiov[0] = unix.Iovec{Base: &io.whdr[0]}
	io.wiov[0].SetLen(VnetHdrLen)
	io.readFn = v.readBatch
	io.writeFn = v.writeOne
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
	io := &v.io
	for {
		_, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&io.wiov[0])), 2)
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
		if len(f) == 0 || len(f) > vnetMaxFrame {
			return i, fmt.Errorf("tap %s: write frame of %d bytes: outside 1..%d", d.name, len(f), vnetMaxFrame)
		}
		if !accept.Accepts(m) {
			if err := d.writeSegmentedLocked(f, m); err != nil {
				return i, err
			}
			continue
		}
		if !m.NeedsCsum && (m.DataValid || m.GSO != offload.GSONone) {
			m = partialForKernel(f, m)
		}
		if err := d.writeVnetLocked(f, VnetHdrFor(f, m)); err != nil {
			return i, err
		}
	}
	return len(frames), nil
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
