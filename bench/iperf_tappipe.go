package bench

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/tap"
)

// FramePort is the part of a host port the tap-pipe baseline needs: a
// kernel TAP (tap.Device) satisfies it.
type FramePort interface {
	ReadFrames(bufs [][]byte, sizes []int) (int, error)
	WriteFrames(frames [][]byte) (int, error)
	BatchSize() int
	io.Closer
}

// TapPipe joins two frame ports back to back with an in-process copy loop
// in each direction: two TAPs in two namespaces joined this way measure
// the cost of a userspace hop alone, without any IPoIB work.
type TapPipe struct {
	a, b      FramePort
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// Frames and WriteErrors count per direction: [0] a->b, [1] b->a.
	Frames      [2]atomic.Uint64
	WriteErrors [2]atomic.Uint64
}

// NewTapPipe starts copying between a and b; maxFrame is the largest frame
// (MTU + 14).
func NewTapPipe(a, b FramePort, maxFrame int) *TapPipe {
	p := &TapPipe{a: a, b: b}
	p.wg.Add(2)
	go p.copyLoop(a, b, 0, maxFrame)
	go p.copyLoop(b, a, 1, maxFrame)
	return p
}

func (p *TapPipe) copyLoop(src, dst FramePort, dir, maxFrame int) {
	defer p.wg.Done()
	n := max(src.BatchSize(), 1)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, maxFrame)
	}
	sizes := make([]int, n)
	out := make([][]byte, n)
	for {
		got, err := src.ReadFrames(bufs, sizes)
		if err != nil {
			return // closed; any other read error also ends the baseline
		}
		for i := range got {
			out[i] = bufs[i][:sizes[i]]
		}
		w, err := dst.WriteFrames(out[:got])
		p.Frames[dir].Add(uint64(w))
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A frame the peer kernel refuses is a drop, like a wire's.
			p.WriteErrors[dir].Add(uint64(got - w))
		}
	}
}

// Close closes both ports, which ends both copy loops, and waits for them.
func (p *TapPipe) Close() error {
	p.closeOnce.Do(func() {
		p.closeErr = errors.Join(p.a.Close(), p.b.Close())
		p.wg.Wait()
	})
	return p.closeErr
}

// PacketPort is the part of a vnet-header TAP (tap.Device opened with
// Config.VnetHdr) the offload tap-pipe needs: one frame per call with its
// virtio header, passed through as the kernel gave it.
type PacketPort interface {
	ReadPacket(buf []byte) (int, tap.VnetHdr, error)
	WritePacket(frame []byte, h tap.VnetHdr) error
	io.Closer
}

// maxPacketFrame is the largest frame a vnet TAP hands over: a 64 KiB
// super frame behind its Ethernet header.
const maxPacketFrame = 65535 + tap.EthHdrLen

// OffloadTapPipe is TapPipe for vnet-header TAPs: each frame crosses with
// its virtio header as it is (super frames whole, partial checksums
// partial), as veth passes an skb. It is the upper bound of a userspace
// TAP bridge: one read and one write per super frame, no checksum or
// segmentation work. A header that fails tap.VnetHdr.Validate is dropped
// and counted rather than handed to the peer kernel.
type OffloadTapPipe struct {
	a, b      PacketPort
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// Per direction, [0] a->b and [1] b->a: frames passed on, super
	// frames among them (GSO headers), frames dropped for a bad header,
	// and frames the peer kernel refused.
	Frames, SuperFrames, BadHeaders, WriteErrors [2]atomic.Uint64
}

// NewOffloadTapPipe starts passing frames between a and b.
func NewOffloadTapPipe(a, b PacketPort) *OffloadTapPipe {
	p := &OffloadTapPipe{a: a, b: b}
	p.wg.Add(2)
	go p.passLoop(a, b, 0)
	go p.passLoop(b, a, 1)
	return p
}

func (p *OffloadTapPipe) passLoop(src, dst PacketPort, dir int) {
	defer p.wg.Done()
	buf := make([]byte, maxPacketFrame)
	for {
		n, h, err := src.ReadPacket(buf)
		if err != nil {
			return
		}
		frame := buf[:n]
		if _, r := h.Validate(frame); r != tap.VnetOK {
			p.BadHeaders[dir].Add(1)
			continue
		}
		if err := dst.WritePacket(frame, h); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.WriteErrors[dir].Add(1)
			continue
		}
		p.Frames[dir].Add(1)
		if h.IsGSO() {
			p.SuperFrames[dir].Add(1)
		}
	}
}

// Close closes both ports, which ends both loops, and waits for them.
func (p *OffloadTapPipe) Close() error {
	p.closeOnce.Do(func() {
		p.closeErr = errors.Join(p.a.Close(), p.b.Close())
		p.wg.Wait()
	})
	return p.closeErr
}
