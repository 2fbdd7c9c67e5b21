package ipoibcm

import (
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// rvReadSignalPort signals every ReadFrames call.
type rvReadSignalPort struct {
	*memPort
	reads chan struct{}
}

func (p *rvReadSignalPort) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	select {
	case p.reads <- struct{}{}:
	default:
	}
	return p.memPort.ReadFrames(bufs, sizes)
}

// The reader finds every TX buffer in flight and stops; the buffers come
// back (as the TX poller gives them back) just before it marks the queue
// stopped, when returnCredits does not wake anyone. The reader must see
// them on its re-check instead of sleeping forever.
func TestReaderStopForBuffersNoLostWakeup(t *testing.T) {
	fab := rvFabric(t, 50)
	port := &rvReadSignalPort{memPort: newMemPort(1, nil), reads: make(chan struct{}, 1)}
	dev := newWrapDevice(t, fab, "a")
	ifc := testInterface(t, dev, port, "a", nil)

	// Every buffer in flight before the reader starts.
	held := make([]int, len(ifc.tx.pool.bufs))
	if n := ifc.tx.pool.take(held); n != len(held) {
		t.Fatalf("took %d of %d buffers", n, len(held))
	}
	// Nothing polls the TX CQ before the reader, finding no buffer,
	// busy-polls it for completions once before it stops the queue: the
	// buffers come back inside that poll, which finds no completion.
	returned := make(chan int, 1)
	var once sync.Once
	dev.polled = func(cq *wrapCQ, wcs []hca.WC) {
		if cq != ifc.txCQ || len(wcs) != 0 {
			return
		}
		once.Do(func() {
			returned <- ifc.tx.pool.available()
			ifc.tx.pool.put(held...)
		})
	}
	startTest(t, ifc)
	select {
	case free := <-returned:
		if free != 0 {
			t.Fatalf("the reader polled with %d buffers free, want none", free)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader never polled for completions without a buffer")
	}
	select {
	case <-port.reads:
	case <-time.After(5 * time.Second):
		t.Fatal("reader never read again after the buffers came back: lost wake-up")
	}
	if got := ifc.tx.gates[0].stopped.Load(); got {
		t.Fatal("queue still marked stopped while reading")
	}
}
