package bench

import (
	"bytes"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// udpTestPort is an in-memory FramePort: frames pushed into in are read,
// frames written appear on out.
type udpTestPort struct {
	in, out   chan []byte
	closed    chan struct{}
	closeOnce sync.Once
}

func newUDPTestPort() *udpTestPort {
	return &udpTestPort{in: make(chan []byte, 16), out: make(chan []byte, 16), closed: make(chan struct{})}
}

func (c *udpTestPort) BatchSize() int { return 1 }

func (c *udpTestPort) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	select {
	case f := <-c.in:
		sizes[0] = copy(bufs[0], f)
		return 1, nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *udpTestPort) WriteFrames(frames [][]byte) (int, error) {
	for _, f := range frames {
		select {
		case c.out <- bytes.Clone(f):
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	return len(frames), nil
}

func (c *udpTestPort) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func listenLoopback(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func recvFrame(t *testing.T, c chan []byte) []byte {
	t.Helper()
	select {
	case f := <-c:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no frame")
		return nil
	}
}

func TestUDPPipeCarriesFramesBothWays(t *testing.T) {
	base := runtime.NumGoroutine()
	ca, cb := listenLoopback(t), listenLoopback(t)
	pa, pb := newUDPTestPort(), newUDPTestPort()
	const maxFrame = 20000
	a, err := NewUDPPipe(pa, ca, ca.LocalAddr().(*net.UDPAddr).AddrPort(), maxFrame)
	if err != nil {
		t.Fatal(err)
	}
	// a sends to b's socket, b back to a's.
	a.peer = cb.LocalAddr().(*net.UDPAddr).AddrPort()
	b, err := NewUDPPipe(pb, cb, ca.LocalAddr().(*net.UDPAddr).AddrPort(), maxFrame)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{60, 1514, 9014, maxFrame} {
		f := make([]byte, n)
		for i := range f {
			f[i] = byte(i*3 + n)
		}
		pa.in <- f
		if got := recvFrame(t, pb.out); !bytes.Equal(got, f) {
			t.Fatalf("a->b frame of %d bytes arrived as %d bytes", n, len(got))
		}
		pb.in <- f[:n/2]
		if got := recvFrame(t, pa.out); !bytes.Equal(got, f[:n/2]) {
			t.Fatalf("b->a frame of %d bytes arrived as %d bytes", n/2, len(got))
		}
	}
	// A datagram larger than any frame is counted, not delivered.
	raw := listenLoopback(t)
	defer raw.Close()
	if _, err := raw.WriteToUDPAddrPort(make([]byte, maxFrame+1), cb.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	pa.in <- []byte("after the oversized one")
	if got := recvFrame(t, pb.out); string(got) != "after the oversized one" {
		t.Fatalf("got %q", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Read after Close: a loop counts a frame only once its write has
	// returned, which may be after the receiver already has the frame.
	if a.Frames[0].Load() != 5 || b.Frames[1].Load() != 5 || b.Errors[1].Load() != 1 {
		t.Fatalf("counters a->udp %d, udp->b %d, b errors %d", a.Frames[0].Load(), b.Frames[1].Load(), b.Errors[1].Load())
	}
	testutil.WaitGoroutines(t, base)
	if _, err := NewUDPPipe(pa, ca, a.peer, MaxUDPPipeFrame+1); err == nil {
		t.Fatal("oversized frame limit accepted")
	}
}
