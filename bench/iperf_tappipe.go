package bench

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
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
