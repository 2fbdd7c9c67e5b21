package netstack

import (
	"context"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var (
	addrA4 = netip.MustParsePrefix("10.0.0.1/24")
	addrB4 = netip.MustParsePrefix("10.0.0.2/24")
	addrA6 = netip.MustParsePrefix("fd00::1/64")
	addrB6 = netip.MustParsePrefix("fd00::2/64")
)

// pair is two hosts joined by Link, with every frame's size observed.
type pair struct {
	a, b   *Host
	pa, pb *observedPort
	stop   func()
}

// newPair builds hosts A (10.0.0.1, fd00::1) and B (10.0.0.2, fd00::2)
// from base and links them; cleanup stops the link and closes both.
// newTestHost is New(cfg), failing the test on an error; the host closes
// when the test ends.
func newTestHost(t testing.TB, cfg Config) *Host {
	t.Helper()
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func newPair(t testing.TB, base Config) *pair {
	t.Helper()
	ca, cb := base, base
	ca.Addrs = []netip.Prefix{addrA4, addrA6}
	cb.Addrs = []netip.Prefix{addrB4, addrB6}
	a, err := New(ca)
	if err != nil {
		t.Fatalf("New A: %v", err)
	}
	b, err := New(cb)
	if err != nil {
		a.Close()
		t.Fatalf("New B: %v", err)
	}
	p := &pair{a: a, b: b, pa: &observedPort{Host: a}, pb: &observedPort{Host: b}}
	p.stop = Link(p.pa, p.pb)
	t.Cleanup(func() {
		p.stop()
		a.Close()
		b.Close()
	})
	return p
}

// observedPort records the largest frame its host sent.
type observedPort struct {
	*Host
	maxFrame atomic.Int64
}

func (o *observedPort) ReadFramesContext(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	n, err := o.Host.ReadFramesContext(ctx, bufs, sizes)
	for _, s := range sizes[:n] {
		for {
			cur := o.maxFrame.Load()
			if int64(s) <= cur || o.maxFrame.CompareAndSwap(cur, int64(s)) {
				break
			}
		}
	}
	return n, err
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// drain empties h's queue without blocking and returns the frames.
func drain(t testing.TB, h *Host) [][]byte {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out [][]byte
	bufs := [][]byte{make([]byte, maxFrameSize)}
	sizes := []int{0}
	for {
		n, err := h.ReadFramesContext(ctx, bufs, sizes)
		if err != nil {
			if !strings.Contains(err.Error(), context.Canceled.Error()) {
				t.Fatalf("drain: %v", err)
			}
			return out
		}
		out = append(out, append([]byte(nil), bufs[0][:sizes[0]]...))
		_ = n
	}
}
