package napi

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/ipoibcm/ipoib/hca"
)

// wcBytes is what SetBytes counts per completion: the WC moved through the
// poll buffer, so MB/s reads as work-completion bandwidth.
const wcBytes = int64(unsafe.Sizeof(hca.WC{}))

// generatorCQ hands out completions from a counter without storing them, so
// the benchmark measures the Context, not a ring.
type generatorCQ struct {
	remaining atomic.Int64
	nextID    uint64 // only the poll goroutine touches it
}

func (g *generatorCQ) Poll(into []hca.WC) int {
	n := int(min(int64(len(into)), g.remaining.Load()))
	for i := range n {
		into[i] = hca.WC{ID: g.nextID, Opcode: hca.WCRecv, ByteLen: 64}
		g.nextID++
	}
	g.remaining.Add(-int64(n))
	return n
}

func (g *generatorCQ) Notify(bool) bool { return g.remaining.Load() > 0 }
func (g *generatorCQ) Destroy() error   { return nil }

// BenchmarkPollBacklog drains a backlog of b.N completions through a
// Context with the default budget and batch: the poll loop's cost per
// completion.
func BenchmarkPollBacklog(b *testing.B) {
	cq := &generatorCQ{}
	var handled int64
	target := int64(b.N)
	done := make(chan struct{})
	ctx, err := New(Config{Name: "bench", CQ: cq, Handle: func(wcs []hca.WC) {
		handled += int64(len(wcs))
		if handled == target {
			close(done)
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	ctx.Start()
	defer ctx.Stop()
	b.SetBytes(wcBytes)
	b.ReportAllocs()
	b.ResetTimer()
	cq.remaining.Store(target)
	ctx.Schedule()
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "completions/s")
}

// BenchmarkEventDriven posts rounds of completions on a ring CQ from another
// goroutine, each round raising an event, so the wake-up, re-arm and
// missed-event paths are in the measurement.
func BenchmarkEventDriven(b *testing.B) {
	const round = 256
	cq := newFakeCQ(round)
	var handled int64
	roundDone := make(chan struct{}, 1)
	ctx, err := New(Config{Name: "bench", CQ: cq, Handle: func(wcs []hca.WC) {
		handled += int64(len(wcs))
		if handled%round == 0 {
			roundDone <- struct{}{}
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	cq.onCompletion = ctx.Schedule
	ctx.Start()
	defer ctx.Stop()
	wcs := make([]hca.WC, round)
	for i := range wcs {
		wcs[i] = recvWC(uint64(i))
	}
	b.SetBytes(wcBytes)
	b.ReportAllocs()
	b.ResetTimer()
	posted := 0
	for posted < b.N {
		n := min(round, b.N-posted)
		if n < round {
			// Keep every round full so Handle's round check holds;
			// the extra completions are not timed as ops.
			n = round
		}
		if err := cq.add(wcs[:n]...); err != nil {
			b.Fatal(err)
		}
		posted += n
		<-roundDone
	}
	b.StopTimer()
	b.ReportMetric(float64(posted)/b.Elapsed().Seconds(), "completions/s")
}
