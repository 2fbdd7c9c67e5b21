package netstack

import (
	"context"
	"fmt"
	"sync"

	"github.com/ipoibcm/ipoib/offload"
)

// FramePort is what Link needs from each side: a Host, or anything else
// with the same batch frame calls and a cancellable read.
type FramePort interface {
	ReadFramesContext(ctx context.Context, bufs [][]byte, sizes []int) (int, error)
	WriteFrames(frames [][]byte) (int, error)
	BatchSize() int
}

// Link joins a and b back to back in memory, like a crossover cable: one
// goroutine per direction moves batches from ReadFrames to WriteFrames. It
// is the benchmark baseline for ib0. stop ends both goroutines and returns
// once they have exited; calling it again is a no-op. A side that is closed
// also ends its direction.
func Link(a, b FramePort) (stop func()) {
	return link(plainMover{a, b}, plainMover{b, a})
}

// OffloadFramePort is a FramePort that also moves frames with offload
// metadata: a Host, or a test's wrapper of one.
type OffloadFramePort interface {
	FramePort
	ReadFramesMetaContext(ctx context.Context, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error)
	WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error)
	HostOffloads() offload.Caps
	SetOffloads(want offload.Caps) (offload.Caps, error)
}

// LinkOffloads is Link with each frame's offload metadata carried across,
// as veth carries an skb's GSO and checksum state: each side reads with
// what the other's host accepts (SetOffloads(peer.HostOffloads())), so
// with Config.GSO a 64 KiB TCP super frame crosses as one frame whatever
// the MTU. It is the "direct link with host GSO on" baseline.
func LinkOffloads(a, b OffloadFramePort) (stop func(), err error) {
	for _, p := range [][2]OffloadFramePort{{a, b}, {b, a}} {
		if _, err := p[0].SetOffloads(p[1].HostOffloads()); err != nil {
			return nil, fmt.Errorf("link offloads: %w", err)
		}
	}
	return link(metaMover{a, b}, metaMover{b, a}), nil
}

// mover is one direction of a link: it reads a batch from its source and
// writes it to its destination.
type mover interface {
	batchSize() int
	read(ctx context.Context, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error)
	write(frames [][]byte, meta []offload.Meta) error
}

type plainMover struct{ src, dst FramePort }

func (m plainMover) batchSize() int { return m.src.BatchSize() }
func (m plainMover) read(ctx context.Context, bufs [][]byte, sizes []int, _ []offload.Meta) (int, error) {
	return m.src.ReadFramesContext(ctx, bufs, sizes)
}
func (m plainMover) write(frames [][]byte, _ []offload.Meta) error {
	_, err := m.dst.WriteFrames(frames)
	return err
}

type metaMover struct{ src, dst OffloadFramePort }

func (m metaMover) batchSize() int { return m.src.BatchSize() }
func (m metaMover) read(ctx context.Context, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	return m.src.ReadFramesMetaContext(ctx, bufs, sizes, meta)
}
func (m metaMover) write(frames [][]byte, meta []offload.Meta) error {
	_, err := m.dst.WriteFramesMeta(frames, meta)
	return err
}

// link runs both directions until stop.
func link(ab, ba mover) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); shuttle(ctx, ab) }()
	go func() { defer wg.Done(); shuttle(ctx, ba) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
}

// shuttle moves frames in one direction until ctx ends or either side
// fails.
func shuttle(ctx context.Context, m mover) {
	n := max(m.batchSize(), 1)
	bufs := make([][]byte, n)
	frames := make([][]byte, n)
	sizes := make([]int, n)
	meta := make([]offload.Meta, n)
	for i := range bufs {
		bufs[i] = make([]byte, maxFrameSize)
	}
	for {
		got, err := m.read(ctx, bufs, sizes, meta)
		if err != nil {
			return
		}
		for i := range got {
			frames[i] = bufs[i][:sizes[i]]
		}
		if err := m.write(frames[:got], meta[:got]); err != nil {
			return
		}
	}
}
