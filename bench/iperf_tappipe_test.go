package bench

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
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

// metaChan is an in-memory MetaPort: frames sent on in are read from it
// with their metadata; frames written to it appear on out. It accepts
// hostCaps and records what SetOffloads asked of it.
type metaChan struct {
	in, out   chan metaFrame
	closed    chan struct{}
	closeOnce sync.Once
	hostCaps  offload.Caps
	set       offload.Caps
}

type metaFrame struct {
	frame []byte
	meta  offload.Meta
}

func newMetaChan(caps offload.Caps) *metaChan {
	return &metaChan{in: make(chan metaFrame, 16), out: make(chan metaFrame, 16), closed: make(chan struct{}), hostCaps: caps}
}

func (p *metaChan) ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	select {
	case f := <-p.in:
		sizes[0], meta[0] = copy(bufs[0], f.frame), f.meta
		return 1, nil
	case <-p.closed:
		return 0, fmt.Errorf("metachan: %w", net.ErrClosed)
	}
}

func (p *metaChan) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	for i, f := range frames {
		select {
		case p.out <- metaFrame{bytes.Clone(f), meta[i]}:
		case <-p.closed:
			return i, fmt.Errorf("metachan: %w", net.ErrClosed)
		}
	}
	return len(frames), nil
}

func (p *metaChan) BatchSize() int             { return 4 }
func (p *metaChan) HostOffloads() offload.Caps { return p.hostCaps }
func (p *metaChan) SetOffloads(want offload.Caps) (offload.Caps, error) {
	p.set = want
	return want, nil
}
func (p *metaChan) Close() error { p.closeOnce.Do(func() { close(p.closed) }); return nil }

// TestOffloadTapPipePassesMeta: each side reads with what the other
// accepts, and frames cross with their metadata as they are, super frames
// whole.
func TestOffloadTapPipePassesMeta(t *testing.T) {
	full := offload.Caps{Csum: true, TSO4: true, TSO6: true}
	a, b := newMetaChan(full), newMetaChan(offload.Caps{Csum: true})
	p, err := NewOffloadTapPipe(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if a.set != b.hostCaps || b.set != a.hostCaps {
		t.Fatalf("offloads set a %+v b %+v, want each the other's host offloads", a.set, b.set)
	}
	super := bytes.Repeat([]byte{7}, 60000)
	m := offload.Meta{GSO: offload.GSOTCPv4, GSOSize: 1448, NeedsCsum: true, CsumStart: 34, CsumOffset: 16}
	a.in <- metaFrame{super, m}
	b.in <- metaFrame{[]byte("plain frame from b"), offload.Meta{}}
	a.in <- metaFrame{[]byte("plain frame from a"), offload.Meta{DataValid: true}}
	if got := <-b.out; !bytes.Equal(got.frame, super) || got.meta != m {
		t.Fatalf("super frame crossed as %d bytes with %+v, want %d with %+v", len(got.frame), got.meta, len(super), m)
	}
	if got := <-b.out; string(got.frame) != "plain frame from a" || !got.meta.DataValid {
		t.Fatalf("b got %q with %+v", got.frame, got.meta)
	}
	if got := <-a.out; string(got.frame) != "plain frame from b" {
		t.Fatalf("a got %q", got.frame)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.Frames[0].Load() != 2 || p.SuperFrames[0].Load() != 1 || p.Frames[1].Load() != 1 || p.SuperFrames[1].Load() != 0 {
		t.Fatalf("a->b frames %d super %d, b->a frames %d super %d; want 2 1 1 0",
			p.Frames[0].Load(), p.SuperFrames[0].Load(), p.Frames[1].Load(), p.SuperFrames[1].Load())
	}
}
