package offload

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkSegment cuts a 64000-byte TCP/IPv4 super frame behind an
// Ethernet header into 1448-byte segments (MTU 1500), as the TAP hands
// them: the per-byte cost of software TSO.
func BenchmarkSegment(b *testing.B) {
	for _, c := range []struct {
		name string
		v6   bool
		tcp  bool
		mss  int
	}{{"tcp4-1448", false, true, 1448}, {"tcp6-4028", true, true, 4028}, {"udp4-1472", false, false, 1472}} {
		b.Run(c.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			f := buildPacket(r, 14, c.v6, c.tcp, 64000)
			out := makeOut(64, 4200)
			b.SetBytes(int64(len(f)))
			b.ReportAllocs()
			for b.Loop() {
				for i := range out {
					out[i] = out[i][:cap(out[i])]
				}
				if _, err := Segment(f, 14, c.mss, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFillChecksums: the cost of IB_SEND_IP_CSUM done in software
// for a 4092-byte IPoIB datagram.
func BenchmarkFillChecksums(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	f := buildPacket(r, 4, false, true, 4092-4-20-32)
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FillChecksums(f, 4); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyChecksums: the receive-side check behind WCIPCsumOK.
func BenchmarkVerifyChecksums(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	f := buildPacket(r, 4, false, true, 4092-4-20-32)
	if _, err := FillChecksums(f, 4); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	for b.Loop() {
		if !VerifyChecksums(f, 4) {
			b.Fatal("invalid")
		}
	}
}

// BenchmarkCompletePartial: finishing a NEEDS_CSUM frame from the TAP.
func BenchmarkCompletePartial(b *testing.B) {
	r := rand.New(rand.NewPCG(4, 4))
	f := buildPacket(r, 14, false, true, 64000)
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	for b.Loop() {
		CompletePartial(f, 34, 16)
	}
}
