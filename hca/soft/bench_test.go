package soft

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

const ipoibCMMsg = 65524

// benchRig is an RC pair with preallocated work requests, posting and
// polling in batches as the IPoIB data path does.
type benchRig struct {
	f      *Fabric
	a, b   hca.QP
	acq    hca.CQ
	bcq    hca.CQ
	sends  []hca.SendWR
	recvs  []hca.RecvWR
	wcs    []hca.WC
	rcvBuf []byte
}

func newBenchRig(tb testing.TB, size, batch int) *benchRig {
	f := NewFabric(Config{})
	da, _ := f.NewDevice("a")
	db, _ := f.NewDevice("b")
	acq, _ := da.CreateCQ(hca.CQConfig{Size: 4 * batch})
	bcq, _ := db.CreateCQ(hca.CQConfig{Size: 4 * batch})
	a, err := da.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: acq, RecvCQ: acq, MaxSendWR: 2 * batch, MaxRecvWR: 2 * batch})
	if err != nil {
		tb.Fatal(err)
	}
	b, err := db.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: bcq, RecvCQ: bcq, MaxSendWR: 2 * batch, MaxRecvWR: 2 * batch})
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range [][2]hca.QP{{a, b}, {b, a}} {
		gid := da.gid
		if p[1] == b {
			gid = db.gid
		}
		must2(tb, p[0].Modify(hca.QPAttr{State: hca.QPStateInit}))
		must2(tb, p[0].Modify(hca.QPAttr{State: hca.QPStateRTR, DestQPN: p[1].QPN(), DestGID: gid}))
		must2(tb, p[0].Modify(hca.QPAttr{State: hca.QPStateRTS}))
	}
	r := &benchRig{f: f, a: a, b: b, acq: acq, bcq: bcq, wcs: make([]hca.WC, batch)}
	src, _ := da.Alloc(size)
	r.rcvBuf, _ = db.Alloc(batch * size)
	for i := range batch {
		r.sends = append(r.sends, hca.SendWR{ID: uint64(i), Data: src})
		r.recvs = append(r.recvs, hca.RecvWR{ID: uint64(i), Buf: r.rcvBuf[i*size : (i+1)*size]})
	}
	return r
}

func must2(tb testing.TB, err error) {
	if err != nil {
		tb.Fatal(err)
	}
}

// round moves one batch: post receives, post sends, poll both CQs.
func (r *benchRig) round(tb testing.TB, n int) {
	if _, err := r.b.PostRecv(r.recvs[:n]); err != nil {
		tb.Fatal(err)
	}
	if _, err := r.a.PostSend(r.sends[:n]); err != nil {
		tb.Fatal(err)
	}
	for got := 0; got < n; {
		got += r.acq.Poll(r.wcs[:n-got])
	}
	for got := 0; got < n; {
		got += r.bcq.Poll(r.wcs[:n-got])
	}
}

func benchRC(b *testing.B, size, batch int) {
	r := newBenchRig(b, size, batch)
	defer r.f.Close()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		r.round(b, n)
		done += n
	}
}

// BenchmarkRC65524 sends IPoIB-CM-sized messages; compare with
// BenchmarkCopy65524, the cost of the copy alone.
func BenchmarkRC65524(b *testing.B) { benchRC(b, ipoibCMMsg, 16) }

// BenchmarkRC64Batched measures per-message overhead: 64-byte messages,
// 64 WRs per post and per poll.
func BenchmarkRC64Batched(b *testing.B) { benchRC(b, 64, 64) }

// BenchmarkCopy65524 is the baseline: a plain copy of the same bytes into
// the same rotating receive buffers.
func BenchmarkCopy65524(b *testing.B) {
	const batch = 16
	src := make([]byte, ipoibCMMsg)
	dst := make([]byte, batch*ipoibCMMsg)
	b.SetBytes(ipoibCMMsg)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i % batch
		copy(dst[j*ipoibCMMsg:(j+1)*ipoibCMMsg], src)
	}
}

func TestRCZeroAllocsPerMessage(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	r := newBenchRig(t, 64, 64)
	defer r.f.Close()
	r.round(t, 64) // warm up
	if avg := testing.AllocsPerRun(100, func() { r.round(t, 64) }); avg != 0 {
		t.Fatalf("%.2f allocations per batch of 64 messages, want 0", avg)
	}
}

// TestRCThroughputVsCopy runs both benchmarks and reports their ratio; the
// RC path must move 65524-byte messages at least half as fast as a copy,
// and 64-byte messages at 1M/s or more.
func TestRCThroughputVsCopy(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("throughput needs a non-race, non-short run")
	}
	cp := testing.Benchmark(BenchmarkCopy65524)
	rc := testing.Benchmark(BenchmarkRC65524)
	small := testing.Benchmark(BenchmarkRC64Batched)
	ratio := float64(cp.NsPerOp()) / float64(rc.NsPerOp())
	rate := 1e9 / float64(small.NsPerOp())
	t.Logf("copy 65524: %v; RC 65524: %v; ratio %.2f", cp, rc, ratio)
	t.Logf("RC 64 batched: %v; %.2f M msg/s; %d allocs/op", small, rate/1e6, small.AllocsPerOp())
	if ratio < 0.5 {
		t.Errorf("RC 65524 at %.2f of copy speed, want >= 0.5", ratio)
	}
	if rate < 1e6 {
		t.Errorf("RC 64-byte rate %.0f/s, want >= 1e6", rate)
	}
	if rc.AllocsPerOp() != 0 || small.AllocsPerOp() != 0 {
		t.Errorf("allocations per message: %d, %d", rc.AllocsPerOp(), small.AllocsPerOp())
	}
}
