package bench

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/tap"
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

// packetChan is an in-memory PacketPort: packets sent on in are read from
// it with their headers; packets written to it appear on out.
type packetChan struct {
	in, out   chan vnetPacket
	closed    chan struct{}
	closeOnce sync.Once
}

type vnetPacket struct {
	frame []byte
	hdr   tap.VnetHdr
}

func newPacketChan() *packetChan {
	return &packetChan{in: make(chan vnetPacket, 16), out: make(chan vnetPacket, 16), closed: make(chan struct{})}
}

func (p *packetChan) ReadPacket(buf []byte) (int, tap.VnetHdr, error) {
	select {
	case pk := <-p.in:
		return copy(buf, pk.frame), pk.hdr, nil
	case <-p.closed:
		return 0, tap.VnetHdr{}, fmt.Errorf("packetchan: %w", net.ErrClosed)
	}
}

func (p *packetChan) WritePacket(frame []byte, h tap.VnetHdr) error {
	select {
	case p.out <- vnetPacket{bytes.Clone(frame), h}:
		return nil
	case <-p.closed:
		return fmt.Errorf("packetchan: %w", net.ErrClosed)
	}
}

func (p *packetChan) Close() error { p.closeOnce.Do(func() { close(p.closed) }); return nil }

// tcp4SuperFrame is an IPv4 TCP frame with payload bytes of payload, its
// checksum left partial, and the virtio header a kernel would give it.
func tcp4SuperFrame(payload, mss int) ([]byte, tap.VnetHdr) {
	f := make([]byte, 14+20+20+payload)
	f[12], f[13] = 0x08, 0x00
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	ip[20+12] = 5 << 4
	return f, tap.VnetHdr{Flags: tap.VnetNeedsCsum, GSOType: tap.GSOTCPv4, HdrLen: 54, GSOSize: uint16(mss), CsumStart: 34, CsumOffset: 16}
}

// TestOffloadTapPipePassesHeaders: frames cross with their virtio headers
// as they are, super frames whole; a header that lies is dropped and
// counted, never handed to the peer.
func TestOffloadTapPipePassesHeaders(t *testing.T) {
	a, b := newPacketChan(), newPacketChan()
	p := NewOffloadTapPipe(a, b)
	super, h := tcp4SuperFrame(60000, 1448)
	a.in <- vnetPacket{super, h}
	liar := h
	liar.GSOSize = 0
	a.in <- vnetPacket{super, liar}
	b.in <- vnetPacket{[]byte("plain frame from b"), tap.VnetHdr{}}
	a.in <- vnetPacket{[]byte("plain frame from a"), tap.VnetHdr{}}
	got := <-b.out
	if !bytes.Equal(got.frame, super) || got.hdr != h {
		t.Fatalf("super frame crossed as %d bytes with %+v, want %d with %+v", len(got.frame), got.hdr, len(super), h)
	}
	if got := <-b.out; string(got.frame) != "plain frame from a" {
		t.Fatalf("b got %q after the super frame; the lying header was not dropped", got.frame)
	}
	if got := <-a.out; string(got.frame) != "plain frame from b" {
		t.Fatalf("a got %q", got.frame)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.Frames[0].Load() != 2 || p.SuperFrames[0].Load() != 1 || p.BadHeaders[0].Load() != 1 || p.Frames[1].Load() != 1 {
		t.Fatalf("a->b frames %d super %d bad %d, b->a frames %d; want 2 1 1 1",
			p.Frames[0].Load(), p.SuperFrames[0].Load(), p.BadHeaders[0].Load(), p.Frames[1].Load())
	}
}
