package bench

import (
	"net"
	"testing"
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
