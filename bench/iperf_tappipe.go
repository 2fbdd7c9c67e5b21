package bench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/offload"
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

// MetaPort is the part of an ipoibcm.OffloadPort the offload tap-pipe
// needs: a kernel TAP opened with a virtio header (tap.Device with
// Config.VnetHdr) satisfies it.
type MetaPort interface {
	ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error)
	WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error)
	BatchSize() int
	HostOffloads() offload.Caps
	SetOffloads(want offload.Caps) (offload.Caps, error)
	io.Closer
}

// maxMetaFrame is the largest frame a vnet TAP hands over: a 64 KiB super
// frame behind its Ethernet header.
const maxMetaFrame = 65535 + 14

// OffloadTapPipe is TapPipe for vnet-header TAPs: each side reads with
// what the other's kernel accepts (SetOffloads(peer.HostOffloads())), so
// frames cross with their offload metadata as the kernel gave them (the
// virtio header decoded, checked and encoded again): super frames whole,
// partial checksums partial, as veth passes an skb. It is the upper bound
// of a userspace TAP bridge: a batch of reads and writes per wake-up, one
// per super frame, and no checksum or segmentation work.
type OffloadTapPipe struct {
	a, b      MetaPort
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// Per direction, [0] a->b and [1] b->a: frames passed on, GSO super
	// frames among them, and frames the peer kernel refused.
	Frames, SuperFrames, WriteErrors [2]atomic.Uint64
}

// NewOffloadTapPipe puts each side's offloads in effect and starts passing
// frames between a and b.
func NewOffloadTapPipe(a, b MetaPort) (*OffloadTapPipe, error) {
	for _, p := range [][2]MetaPort{{a, b}, {b, a}} {
		if _, err := p[0].SetOffloads(p[1].HostOffloads()); err != nil {
			return nil, fmt.Errorf("offload tap-pipe: %w", err)
		}
	}
	p := &OffloadTapPipe{a: a, b: b}
	p.wg.Add(2)
	go p.passLoop(a, b, 0)
	go p.passLoop(b, a, 1)
	return p, nil
}

func (p *OffloadTapPipe) passLoop(src, dst MetaPort, dir int) {
	defer p.wg.Done()
	n := max(src.BatchSize(), 1)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, maxMetaFrame)
	}
	sizes := make([]int, n)
	meta := make([]offload.Meta, n)
	out := make([][]byte, n)
	for {
		got, err := src.ReadFramesMeta(bufs, sizes, meta)
		if err != nil {
			return
		}
		super := 0
		for i := range got {
			out[i] = bufs[i][:sizes[i]]
			if meta[i].GSO != offload.GSONone {
				super++
			}
		}
		w, err := dst.WriteFramesMeta(out[:got], meta[:got])
		p.Frames[dir].Add(uint64(w))
		p.SuperFrames[dir].Add(uint64(super))
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.WriteErrors[dir].Add(uint64(got - w))
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
