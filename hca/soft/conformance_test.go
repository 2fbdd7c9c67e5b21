package soft

import (
	"fmt"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/hcatest"
)

// suiteFabric adapts a soft Fabric to the conformance suite.
type suiteFabric struct {
	f     *Fabric
	props hcatest.Properties
	n     int
}

func newSuiteFabric(t *testing.T, cfg Config, props hcatest.Properties) *suiteFabric {
	f := NewFabric(cfg)
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close fabric: %v", err)
		}
		if g := f.Stats().Goroutines; g != 0 {
			t.Errorf("%d fabric goroutines still running after Close", g)
		}
	})
	return &suiteFabric{f: f, props: props}
}

func (s *suiteFabric) Properties() hcatest.Properties { return s.props }

func (s *suiteFabric) NewDevice(t *testing.T) hca.Device {
	t.Helper()
	s.n++
	d, err := s.f.NewDevice(fmt.Sprintf("soft%d", s.n))
	if err != nil {
		t.Fatalf("new device: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func (s *suiteFabric) NewDeviceWithPKeys(t *testing.T, pkeys []hca.PKey) hca.Device {
	t.Helper()
	d := s.NewDevice(t)
	if err := d.(*Device).SetPKeyTable(pkeys); err != nil {
		t.Fatalf("set P_Key table: %v", err)
	}
	return d
}

func (s *suiteFabric) SetPKeyTable(t *testing.T, dev hca.Device, table []hca.PKey) {
	t.Helper()
	if err := dev.(*Device).SetPKeyTable(table); err != nil {
		t.Fatalf("set P_Key table: %v", err)
	}
}

func (s *suiteFabric) SetLinkUp(t *testing.T, dev hca.Device, up bool) { dev.(*Device).SetLinkUp(up) }

// fastTimers scales the IBTA timers down so retry paths take microseconds.
const fastTimers = 0.01

func TestConformance(t *testing.T) {
	hcatest.Run(t, func(t *testing.T) hcatest.Fabric {
		return newSuiteFabric(t, Config{Seed: 1, TimerScale: fastTimers}, hcatest.Properties{OffloadedRecv: hca.WCCsumPartial})
	})
}

// TestConformanceWithFaults runs the suite with every fault the contract
// allows: delayed completions, spurious completion events, delayed
// LAST_WQE_REACHED, immediate QPN reuse and injected RNR (only for QPs that
// retry; the suite's RNR-0 tests see real empty queues).
func TestConformanceWithFaults(t *testing.T) {
	faults := Faults{
		CompletionDelay:          CompletionDelay{Probability: 0.2, Max: 2 * time.Millisecond},
		ImmediateQPNReuse:        true,
		LastWQEDelay:             3 * time.Millisecond,
		SpuriousCompletionEvents: 0.3,
	}
	hcatest.Run(t, func(t *testing.T) hcatest.Fabric {
		return newSuiteFabric(t, Config{Seed: 7, TimerScale: fastTimers, Faults: faults}, hcatest.Properties{OffloadedRecv: hca.WCCsumPartial})
	})
}

// TestConformanceLossyPurging runs it again with UD loss and the mlx5-style
// purge of a destroyed QP's completions.
func TestConformanceLossyPurging(t *testing.T) {
	faults := Faults{UDLoss: 0.3, DestroyedQPCompletions: PurgeCompletionsOnDestroy}
	hcatest.Run(t, func(t *testing.T) hcatest.Fabric {
		return newSuiteFabric(t, Config{Seed: 3, TimerScale: fastTimers, Faults: faults},
			hcatest.Properties{LossyUD: true, PurgesCompletionsOnDestroy: true, OffloadedRecv: hca.WCCsumPartial})
	})
}
