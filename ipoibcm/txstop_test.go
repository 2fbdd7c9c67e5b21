package ipoibcm

import (
	"sync"
	"testing"
	"time"
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
	dev, err := fab.NewDevice("a")
	if err != nil {
		t.Fatal(err)
	}
	ifc, err := New(Config{Device: dev, Host: port, Mode: ModeConnected, CM: fastCM()})
	if err != nil {
		t.Fatal(err)
	}
	defer ifc.Close()

	// Every buffer in flight before the reader starts.
	held := make([]int, len(ifc.pool.bufs))
	if n := ifc.pool.take(held); n != len(held) {
		t.Fatalf("took %d of %d buffers", n, len(held))
	}
	var once sync.Once
	stops := make(chan stopReason, 4)
	ifc.hooks.beforeTXStop = func(why stopReason) {
		stops <- why
		once.Do(func() { ifc.pool.put(held...) })
	}
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case why := <-stops:
		if why != stopForBuffers {
			t.Fatalf("reader stopped for %v, want %v", why, stopForBuffers)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader never stopped for buffers")
	}
	select {
	case <-port.reads:
	case <-time.After(5 * time.Second):
		t.Fatal("reader never read again after the buffers came back: lost wake-up")
	}
	if got := ifc.txStopped.Load(); got {
		t.Fatal("queue still marked stopped while reading")
	}
}
