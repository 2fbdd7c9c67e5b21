package rocev2

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/hcatest"
)

// suiteFabric adapts testFabric to hcatest.Fabric, hcatest.PKeyFabric and
// hcatest.PKeyTableFabric.
type suiteFabric struct {
	*testFabric
	lossy bool
}

func (f suiteFabric) NewDevice(t *testing.T) hca.Device { return f.newDevice(t) }

func (f suiteFabric) NewDeviceWithPKeys(t *testing.T, pkeys []hca.PKey) hca.Device {
	cfg := f.config(t)
	cfg.PKeys = pkeys
	return f.open(t, cfg)
}

func (f suiteFabric) SetPKeyTable(t *testing.T, dev hca.Device, table []hca.PKey) {
	t.Helper()
	if err := dev.(*Device).SetPKeyTable(table); err != nil {
		t.Fatalf("set P_Key table: %v", err)
	}
}

func (f suiteFabric) Properties() hcatest.Properties {
	return hcatest.Properties{LossyUD: f.lossy, WaitTimeout: 20 * time.Second, OffloadedRecv: hca.WCIPCsumOK}
}

func TestConformance(t *testing.T) {
	hcatest.Run(t, func(t *testing.T) hcatest.Fabric {
		return suiteFabric{testFabric: newTestFabric(t, 10, Faults{})}
	})
}

// TestConformanceDuplicates runs the suite with 5% of datagrams sent
// twice: RC hides them (duplicates are re-ACKed and not delivered again)
// without spending retries, so even retry-count-0 tests must pass. UD
// duplicates are real on an unreliable transport, so UD tests that count
// deliveries are skipped as lossy.
func TestConformanceDuplicates(t *testing.T) {
	hcatest.Run(t, func(t *testing.T) hcatest.Fabric {
		return suiteFabric{testFabric: newTestFabric(t, 11, Faults{Seed: 7, Duplicate: 0.05}), lossy: true}
	})
}
