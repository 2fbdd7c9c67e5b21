package bench

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
)

// chanPort is an in-memory FramePort: frames written to it appear on out;
// frames sent on in are read from it.
type chanPort struct {
	in, out   chan []byte
	closed    chan struct{}
	closeOnce sync.Once
	failWrite bool
	refused   chan struct{} // one token per refused WriteFrames call
}

func newChanPort() *chanPort {
	return &chanPort{in: make(chan []byte, 16), out: make(chan []byte, 16), closed: make(chan struct{}), refused: make(chan struct{}, 16)}
}

func (p *chanPort) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	select {
	case f := <-p.in:
		sizes[0] = copy(bufs[0], f)
		return 1, nil
	case <-p.closed:
		return 0, fmt.Errorf("chanport: %w", net.ErrClosed)
	}
}

func (p *chanPort) WriteFrames(frames [][]byte) (int, error) {
	if p.failWrite {
		p.refused <- struct{}{}
		return 0, errors.New("refused")
	}
	for _, f := range frames {
		select {
		case p.out <- bytes.Clone(f):
		case <-p.closed:
			return 0, fmt.Errorf("chanport: %w", net.ErrClosed)
		}
	}
	return len(frames), nil
}

func (p *chanPort) BatchSize() int { return 1 }
func (p *chanPort) Close() error   { p.closeOnce.Do(func() { close(p.closed) }); return nil }

func TestTapPipeCopiesBothWaysAndStops(t *testing.T) {
	a, b := newChanPort(), newChanPort()
	p := NewTapPipe(a, b, 64)
	a.in <- []byte("from a")
	b.in <- []byte("from b")
	if got := <-b.out; string(got) != "from a" {
		t.Fatalf("b got %q", got)
	}
	if got := <-a.out; string(got) != "from b" {
		t.Fatalf("a got %q", got)
	}
	// A frame longer than maxFrame is cut, as a TAP read would.
	a.in <- bytes.Repeat([]byte{'x'}, 100)
	if got := <-b.out; len(got) != 64 {
		t.Fatalf("oversize frame copied as %d bytes, want 64", len(got))
	}
	if err := p.Close(); err != nil { // waits for both loops
		t.Fatal(err)
	}
	if p.Frames[0].Load() != 2 || p.Frames[1].Load() != 1 {
		t.Fatalf("frames a->b %d b->a %d, want 2 1", p.Frames[0].Load(), p.Frames[1].Load())
	}
}

func TestTapPipeCountsWriteErrors(t *testing.T) {
	a, b := newChanPort(), newChanPort()
	b.failWrite = true
	p := NewTapPipe(a, b, 64)
	a.in <- []byte("lost")
	a.in <- []byte("lost too")
	<-b.refused
	<-b.refused
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := p.WriteErrors[0].Load(); got != 2 {
		t.Fatalf("write errors %d, want 2", got)
	}
	if got := p.Frames[0].Load(); got != 0 {
		t.Fatalf("frames counted as copied: %d, want 0", got)
	}
}
