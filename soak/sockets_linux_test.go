package soak

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// TestOpenSocketsCounts: the leak check's socket count sees a socket
// opened and closed.
func TestOpenSocketsCounts(t *testing.T) {
	before := openSockets()
	if before < 0 {
		t.Fatal("no /proc/self/fd")
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if n := openSockets(); n != before+1 {
		c.Close()
		t.Fatalf("%d sockets with one more open, %d before", n, before)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := openSockets(); n != before {
		t.Fatalf("%d sockets after close, %d before", n, before)
	}
}

// leakyBackend is a backend that leaves a socket open after close.
type leakyBackend struct {
	soakBackend
	leak *net.UDPConn
}

func (b *leakyBackend) device(k int) (hca.Device, error) {
	if k == 0 {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return nil, err
		}
		b.leak = c
	}
	return b.soakBackend.device(k)
}

// TestSoakCatchesLeakedSocket: a socket the backend leaves open after
// its close fails the soak's leak invariant.
func TestSoakCatchesLeakedSocket(t *testing.T) {
	var lb *leakyBackend
	cfg := shortSoak(t, func(p Progress) bool { return p.Engine.StaleReaped >= minStaleReaps })
	cfg.Hosts = 4
	rep, err := runSoak(context.Background(), cfg, func(c *Config, tap soft.Tap) (soakBackend, error) {
		b, err := newSoakBackend(c, tap)
		lb = &leakyBackend{soakBackend: b}
		return lb, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if lb.leak == nil {
		t.Fatal("no socket leaked")
	}
	lb.leak.Close()
	var first string
	for _, inv := range rep.Invariants {
		if inv.Name == violLeak.String() {
			first = inv.First
		}
	}
	if violations(rep, violLeak.String()) == 0 || !strings.Contains(first, "sockets open after Close") {
		t.Fatalf("leaked socket not reported: %d leak violations, first %q", violations(rep, violLeak.String()), first)
	}
}
