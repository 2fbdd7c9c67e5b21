package frame

import (
	"math/rand/v2"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

func TestChecksumMatchesGVisor(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for size := range 300 {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if got, want := checksumFold(checksumAdd(0, b)), checksum.Checksum(b, 0); got != want {
			t.Fatalf("size %d: checksum %#04x, gVisor %#04x", size, got, want)
		}
	}
	// All ones stresses the carries.
	ones := make([]byte, 65535)
	for i := range ones {
		ones[i] = 0xff
	}
	if got, want := checksumFold(checksumAdd(0, ones)), checksum.Checksum(ones, 0); got != want {
		t.Fatalf("all ones: %#04x, gVisor %#04x", got, want)
	}
}
