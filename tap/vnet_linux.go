package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/offload"
)

// Offloads is the set of TUNSETOFFLOAD flags the kernel accepted: what the
// host stack may hand us unfinished (partial checksums, TSO and USO super
// frames) and what we may hand it.
type Offloads uint32

// The offloads this package asks for.
const (
	OffloadCsum Offloads = unix.TUN_F_CSUM
	OffloadTSO4 Offloads = unix.TUN_F_TSO4
	OffloadTSO6 Offloads = unix.TUN_F_TSO6
	OffloadUSO4 Offloads = unix.TUN_F_USO4
	OffloadUSO6 Offloads = unix.TUN_F_USO6
)

func (o Offloads) String() string {
	var s []string
	for _, f := range []struct {
		bit  Offloads
		name string
	}{{OffloadCsum, "csum"}, {OffloadTSO4, "tso4"}, {OffloadTSO6, "tso6"}, {OffloadUSO4, "uso4"}, {OffloadUSO6, "uso6"}} {
		if o&f.bit != 0 {
			s = append(s, f.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// offloadLadder is tried in order until the kernel accepts one: USO needs
// Linux 6.2, TSO needs checksum offload, and checksum offload alone still
// saves the host a pass over every frame.
var offloadLadder = []Offloads{
	OffloadCsum | OffloadTSO4 | OffloadTSO6 | OffloadUSO4 | OffloadUSO6,
	OffloadCsum | OffloadTSO4 | OffloadTSO6,
	OffloadCsum,
	0,
}

// VnetMaxSegments caps how many MTU-sized frames one super frame from the
// host may become (the TAP's gso_max_segs): ReadFrames segments into the
// caller's batch, so BatchSize is this in vnet mode.
const VnetMaxSegments = 64

// vnetMaxFrame is the largest frame a TAP read returns: a 64 KiB GSO
// super frame plus its Ethernet header.
const vnetMaxFrame = 65535 + EthHdrLen

// vnet is the IFF_VNET_HDR half of a Device: the offloads in force, the
// scratch buffers of the one reader and the serialised writers, and the
// counted drops.
type vnet struct {
	// offloads is the Offloads in force (SetOffloads may change it).
	offloads atomic.Uint32
	// usoKnown: the kernel accepted USO at open (Linux 6.2), so it also
	// takes USO super frames we write.
	usoKnown bool
	setMu    sync.Mutex // serialises SetOffloads

	io     vnetIO // ReadFramesMeta / WriteFramesMeta
	segBuf []byte // writers' software segmentation scratch (txMu)

	rxBuf  []byte   // reader only
	segOut [][]byte // reader only

	txMu  sync.Mutex
	txBuf []byte

	drops      [VnetDropReasons]atomic.Uint64
	segOverrun atomic.Uint64
}

// openVnet opens /dev/net/tun as a TAP with IFF_VNET_HDR, as wireguard-go's
// tun_linux.go opens its TUN (water has no way to set the flag), sets the
// header size and offers the kernel the first offload set of ladder it
// accepts. With multi the fd is one queue of an IFF_MULTI_QUEUE TAP: the
// first such open creates the device, each later one with the same name
// attaches another queue to it.
func openVnet(name string, multi bool, ladder []Offloads) (*os.File, string, Offloads, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", 0, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	fail := func(err error) (*os.File, string, Offloads, error) {
		unix.Close(fd)
		return nil, "", 0, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fail(fmt.Errorf("ifreq %q: %w", name, err))
	}
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if multi {
		flags |= unix.IFF_MULTI_QUEUE
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fail(fmt.Errorf("tunsetiff: %w", err))
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VnetHdrLen); err != nil {
		return fail(fmt.Errorf("tunsetvnethdrsz %d: %w", VnetHdrLen, err))
	}
	var got Offloads
	for _, o := range ladder {
		if err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, int(o)); err == nil {
			got = o
			break
		}
	}
	if err != nil {
		return fail(fmt.Errorf("tunsetoffload: %w", err))
	}
	// Non-blocking so the runtime poller owns the fd and Close unblocks a
	// pending Read.
	if err := unix.SetNonblock(fd, true); err != nil {
		return fail(fmt.Errorf("nonblock: %w", err))
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), ifr.Name(), got, nil
}

func newVnet(f *os.File, o Offloads) (*vnet, error) {
	v := &vnet{
		usoKnown: o&(OffloadUSO4|OffloadUSO6) != 0,
		rxBuf:    make([]byte, VnetHdrLen+vnetMaxFrame),
		segOut:   make([][]byte, VnetMaxSegments),
		txBuf:    make([]byte, VnetHdrLen+vnetMaxFrame),
	}
	v.offloads.Store(uint32(o))
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("syscallconn: %w", err)
	}
	v.initIO(rc)
	return v, nil
}

// limitSegments keeps the host's super frames within one ReadFrames batch.
func limitSegments(h *netlink.Handle, link netlink.Link) error {
	if err := h.LinkSetGSOMaxSegs(link, VnetMaxSegments); err != nil {
		return fmt.Errorf("gso_max_segs %d: %w", VnetMaxSegments, err)
	}
	return nil
}

// Offloads reports what the kernel accepted (0 without Config.VnetHdr).
func (d *Device) Offloads() Offloads {
	if d.vnet == nil {
		return 0
	}
	return Offloads(d.vnet.offloads.Load())
}

// VnetDrops returns how many frames from the host were dropped because
// their virtio header lied in the way r names.
func (d *Device) VnetDrops(r VnetDrop) uint64 {
	if d.vnet == nil || r == VnetOK || int(r) >= VnetDropReasons {
		return 0
	}
	return d.vnet.drops[r].Load()
}

// SegmentDrops returns how many super frames ReadFrames dropped because
// their segments did not fit the caller's batch or buffers.
func (d *Device) SegmentDrops() uint64 {
	if d.vnet == nil {
		return 0
	}
	return d.vnet.segOverrun.Load()
}

func (d *Device) ioErr(op string, err error) error {
	if d.closed.Load() || errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("tap %s: %s: %w", d.name, op, net.ErrClosed)
	}
	return fmt.Errorf("tap %s: %s: %w", d.name, op, err)
}

// ReadPacket reads one frame with its offload metadata as the kernel gave
// them: buf receives the Ethernet frame (a super frame up to 64 KiB under
// TSO/USO). The header is returned undecoded of trust: call Validate
// before acting on it. Only with Config.VnetHdr; one reader at a time
// (ReadPacket and ReadFrames share the receive buffer).
func (d *Device) ReadPacket(buf []byte) (int, VnetHdr, error) {
	if d.vnet == nil {
		return 0, VnetHdr{}, fmt.Errorf("tap %s: read packet: opened without VnetHdr: %w", d.name, errors.ErrUnsupported)
	}
	rx := d.vnet.rxBuf
	for {
		n, err := d.file.Read(rx)
		if err != nil {
			return 0, VnetHdr{}, d.ioErr("read", err)
		}
		h, ok := DecodeVnetHdr(rx[:n])
		if !ok {
			d.vnet.drops[VnetDropShort].Add(1)
			continue
		}
		return copy(buf, rx[VnetHdrLen:n]), h, nil
	}
}

// WritePacket hands the host one frame with its offload metadata: a super
// frame with a GSO header, or a frame whose checksum is partial
// (VnetNeedsCsum) or already verified (VnetDataValid).
func (d *Device) WritePacket(frame []byte, h VnetHdr) error {
	if d.vnet == nil {
		return fmt.Errorf("tap %s: write packet: opened without VnetHdr: %w", d.name, errors.ErrUnsupported)
	}
	v := d.vnet
	if len(frame) > vnetMaxFrame {
		return fmt.Errorf("tap %s: write packet of %d bytes: larger than %d", d.name, len(frame), vnetMaxFrame)
	}
	v.txMu.Lock()
	defer v.txMu.Unlock()
	h.Encode(v.txBuf)
	n := copy(v.txBuf[VnetHdrLen:], frame)
	if _, err := d.file.Write(v.txBuf[:VnetHdrLen+n]); err != nil {
		return d.ioErr(fmt.Sprintf("write frame of %d bytes", len(frame)), err)
	}
	return nil
}

// readFramesVnet is ReadFrames with IFF_VNET_HDR: it finishes in software
// what the host left to the "NIC": a partial checksum is completed, a
// super frame is cut into MTU-sized frames across bufs. A frame whose
// header lies is dropped under its reason and the read goes on.
func (d *Device) readFramesVnet(bufs [][]byte, sizes []int) (int, error) {
	v := d.vnet
	for {
		n, err := d.file.Read(v.rxBuf)
		if err != nil {
			return 0, d.ioErr("read", err)
		}
		h, ok := DecodeVnetHdr(v.rxBuf[:n])
		if !ok {
			v.drops[VnetDropShort].Add(1)
			continue
		}
		frame := v.rxBuf[VnetHdrLen:n]
		hd, reason := h.Validate(frame)
		if reason != VnetOK {
			v.drops[reason].Add(1)
			continue
		}
		if !h.IsGSO() {
			if h.NeedsCsum() {
				offload.CompletePartial(frame, int(h.CsumStart), int(h.CsumOffset))
			}
			sizes[0] = copy(bufs[0], frame)
			return 1, nil
		}
		k := min(len(bufs), len(sizes), len(v.segOut))
		copy(v.segOut, bufs[:k])
		m, err := offload.Segment(frame[:hd.Len], EthHdrLen, int(h.GSOSize), v.segOut[:k])
		if err != nil {
			v.segOverrun.Add(1)
			continue
		}
		for i := range m {
			sizes[i] = len(v.segOut[i])
			v.segOut[i] = nil
		}
		return m, nil
	}
}

// writeFramesVnet is WriteFrames with IFF_VNET_HDR: each frame goes out
// behind an empty header (complete checksums, nothing to segment), so the
// host verifies them as it does without the flag.
func (d *Device) writeFramesVnet(frames [][]byte) (int, error) {
	for i, f := range frames {
		if err := d.WritePacket(f, VnetHdr{}); err != nil {
			return i, err
		}
	}
	return len(frames), nil
}
