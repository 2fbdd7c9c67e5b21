package netstack

import (
	"context"
	"sync"
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
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); shuttle(ctx, a, b) }()
	go func() { defer wg.Done(); shuttle(ctx, b, a) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
}

// shuttle moves frames from src to dst until ctx ends or either side fails.
func shuttle(ctx context.Context, src, dst FramePort) {
	n := max(src.BatchSize(), 1)
	bufs := make([][]byte, n)
	frames := make([][]byte, n)
	sizes := make([]int, n)
	for i := range bufs {
		bufs[i] = make([]byte, maxFrameSize)
	}
	for {
		got, err := src.ReadFramesContext(ctx, bufs, sizes)
		if err != nil {
			return
		}
		for i := range got {
			frames[i] = bufs[i][:sizes[i]]
		}
		if _, err := dst.WriteFrames(frames[:got]); err != nil {
			return
		}
	}
}
