package testutil

import (
	"bytes"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// UDPSegmentRounds sends rounds of one size-byte UDP_SEGMENT write (USO:
// the kernel may hand the device one super frame) from tx to rx, a
// connected pair, and checks that rx reads each round as seg-byte
// datagrams (the last one shorter) carrying exactly the bytes written. It
// skips the test where the kernel has no UDP_SEGMENT.
func UDPSegmentRounds(t testing.TB, tx, rx *net.UDPConn, seg, size, rounds int) {
	t.Helper()
	rc, err := tx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, seg) }); err != nil || serr != nil {
		t.Skipf("UDP_SEGMENT not available: %v %v", err, serr)
	}
	data := make([]byte, size)
	got := make([]byte, 65536)
	r := rand.New(rand.NewPCG(3, 3))
	for round := range rounds {
		for k := range data {
			data[k] = byte(r.Uint32())
		}
		if _, err := tx.Write(data); err != nil {
			t.Fatalf("round %d: write: %v", round, err)
		}
		rx.SetReadDeadline(time.Now().Add(10 * time.Second))
		for off := 0; off < size; {
			n, err := rx.Read(got)
			if err != nil {
				t.Fatalf("round %d: read at %d: %v", round, off, err)
			}
			if want := min(seg, size-off); n != want || !bytes.Equal(got[:n], data[off:off+n]) {
				t.Fatalf("round %d: datagram at %d: %d bytes (want %d) or contents differ", round, off, n, want)
			}
			off += n
		}
	}
}
