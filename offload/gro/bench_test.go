package gro

import (
	"testing"

	"github.com/ipoibcm/ipoib/offload"
)

// BenchmarkCoalesce measures one batch through Add and Flush (and, for
// the -gather cases, a Config.Gather coalescer through Add and FlushVec,
// which copies no payload). Bytes are
// the input frames' bytes, so MB/s compares with the link rate the
// coalescer keeps up with on one core.
func BenchmarkCoalesce(b *testing.B) {
	one := func(k csumKind, n, mss int) func() ([][]byte, []offload.Meta) {
		return func() ([][]byte, []offload.Meta) {
			p := basePkt(false)
			p.csum, p.opts = k, tsOpt(1, 2)
			return frames(chain(p, n, mss))
		}
	}
	for _, c := range []struct {
		name  string
		batch func() ([][]byte, []offload.Meta)
		want  int // frames out
	}{
		// 44 MSS-1448 segments (MTU 1500 with timestamps): one 64 KiB frame.
		{"tcp4-44x1448-verified", one(csumValid, 44, 1448), 1},
		{"tcp4-44x1448-partial", one(csumPartial, 44, 1448), 1},
		// Checksums verified here (CHECKSUM_NONE): the software cost of
		// IB_WC_IP_CSUM_OK missing.
		{"tcp4-44x1448-unverified", one(csumNone, 44, 1448), 1},
		// A 64-frame poll batch of IPoIB datagram mode (MTU 4092, MSS 4040).
		{"tcp4-64x4040-verified", one(csumValid, 64, 4040), 4},
		{"mixed", mixedBatch, 15},
		{"udp-passthrough", udpBatch, 64},
	} {
		for _, gather := range []bool{false, true} {
			name := c.name
			if gather {
				// Config.Gather with FlushVec: the pieces a writev takes.
				name += "-gather"
			}
			b.Run(name, func(b *testing.B) {
				fs, ms := c.batch()
				co := newC(b, Config{Gather: gather})
				size := 0
				for _, f := range fs {
					size += len(f)
				}
				var got int
				emit := func([]byte, offload.Meta) { got++ }
				emitVec := func([][]byte, offload.Meta) { got++ }
				flush := func() {
					if gather {
						co.FlushVec(emitVec)
					} else {
						co.Flush(emit)
					}
				}
				for i := range fs { // the super-frame buffers, allocated once
					co.Add(fs[i], ms[i])
				}
				flush()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					got = 0
					for i := range fs {
						co.Add(fs[i], ms[i])
					}
					flush()
					if got != c.want {
						b.Fatalf("%d frames out, want %d", got, c.want)
					}
				}
			})
		}
	}
}

// mixedBatch is 64 frames: four TCP flows (IPv4 and IPv6) interleaved
// with a pure ACK of a fifth and a UDP datagram every so often.
func mixedBatch() ([][]byte, []offload.Meta) {
	var flows [4][]pkt
	for k := range flows {
		p := basePkt(k%2 == 1)
		p.sport, p.opts = uint16(2000+k), tsOpt(uint32(k), 0)
		flows[k] = chain(p, 14, 1448)
	}
	var fs [][]byte
	var ms []offload.Meta
	add := func(p pkt) {
		f, m := p.frame()
		fs, ms = append(fs, f), append(ms, m)
	}
	for i := range 14 {
		for k := range flows {
			add(flows[k][i])
		}
		if i%2 == 0 {
			a := basePkt(false)
			a.sport = 3000
			add(a)
		}
		if i%4 == 0 {
			u := basePkt(false)
			u.udp, u.payload = true, payload(200, 0)
			add(u)
		}
	}
	// 56 TCP + 7 ACKs + 4 UDP = 67; trimmed to a 64-frame batch, that is
	// four super frames and 11 frames passed through.
	return fs[:64], ms[:64]
}

func udpBatch() ([][]byte, []offload.Meta) {
	var fs [][]byte
	var ms []offload.Meta
	for range 64 {
		u := basePkt(false)
		u.udp, u.payload = true, payload(1472, 0)
		f, m := u.frame()
		fs, ms = append(fs, f), append(ms, m)
	}
	return fs, ms
}
