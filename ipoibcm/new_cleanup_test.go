package ipoibcm

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
)

var errRVInjected = errors.New("injected failure")

// rvFailingDevice fails the failAt-th resource operation (creating a CQ,
// SRQ, QP or AH, allocating memory, or a QP's Modify or PostRecv); 0
// fails none. It counts the operations either way.
type rvFailingDevice struct {
	hca.Device
	mu     sync.Mutex
	failAt int
	ops    int
}

func (d *rvFailingDevice) step(op string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ops++
	if d.ops == d.failAt {
		return fmt.Errorf("%s (operation %d): %w", op, d.ops, errRVInjected)
	}
	return nil
}

func (d *rvFailingDevice) Alloc(size int) ([]byte, error) {
	if err := d.step("alloc"); err != nil {
		return nil, err
	}
	return d.Device.Alloc(size)
}

func (d *rvFailingDevice) CreateCQ(cfg hca.CQConfig) (hca.CQ, error) {
	if err := d.step("create CQ"); err != nil {
		return nil, err
	}
	return d.Device.CreateCQ(cfg)
}

func (d *rvFailingDevice) CreateSRQ(cfg hca.SRQConfig) (hca.SRQ, error) {
	if err := d.step("create SRQ"); err != nil {
		return nil, err
	}
	return d.Device.CreateSRQ(cfg)
}

func (d *rvFailingDevice) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	if err := d.step("create QP"); err != nil {
		return nil, err
	}
	qp, err := d.Device.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	return &rvFailingQP{QP: qp, d: d}, nil
}

func (d *rvFailingDevice) CreateAH(dgid hca.GID) (hca.AH, error) {
	if err := d.step("create AH"); err != nil {
		return nil, err
	}
	return d.Device.CreateAH(dgid)
}

type rvFailingQP struct {
	hca.QP
	d *rvFailingDevice
}

func (q *rvFailingQP) Modify(attr hca.QPAttr) error {
	if err := q.d.step("modify QP to " + attr.State.String()); err != nil {
		return err
	}
	return q.QP.Modify(attr)
}

func (q *rvFailingQP) PostRecv(wrs []hca.RecvWR) (int, error) {
	if err := q.d.step("post receives"); err != nil {
		return 0, err
	}
	return q.QP.PostRecv(wrs)
}

// rvSmallPort keeps New's allocations small so every failure point can be
// tried quickly.
type rvSmallPort struct{ *memPort }

func (rvSmallPort) BatchSize() int { return 1 }

// Whichever resource New fails to create, it returns the error and
// leaves nothing behind on the device: no QP, CQ, SRQ or AH (a leaked QP
// would also keep its CQs alive, the backend refusing to destroy them).
func TestNewFailureLeaksNothing(t *testing.T) {
	for _, v := range []struct {
		name  string
		tweak func(*Config)
	}{
		{"srq", nil},
		{"no-srq", func(c *Config) { c.DisableSRQ = true }},
		{"datagram-only", func(c *Config) { c.DisableCM, c.Mode = true, ModeDatagram }},
	} {
		t.Run(v.name, func(t *testing.T) {
			fab := rvFabric(t, 30)
			softDev, err := fab.NewDevice("leak")
			if err != nil {
				t.Fatal(err)
			}
			base := fab.Stats()
			newIfc := func(failAt int) (*rvFailingDevice, *Interface, error) {
				dev := &rvFailingDevice{Device: softDev, failAt: failAt}
				cfg := Config{
					Device: dev, Host: rvSmallPort{newMemPort(1, nil)}, Mode: ModeConnected,
					SendQueueSize: 4, RecvQueueSize: 4, UDRecvQueueSize: 4,
					CM: cm.Options{QueueDepth: 4, Seed: 1},
				}
				if v.tweak != nil {
					v.tweak(&cfg)
				}
				ifc, err := New(cfg)
				return dev, ifc, err
			}
			dev, ifc, err := newIfc(0)
			if err != nil {
				t.Fatal(err)
			}
			total := dev.ops
			if err := ifc.Close(); err != nil {
				t.Fatal(err)
			}
			rvCheckNoLeak(t, "after a successful New and Close", base, fab.Stats())
			for n := 1; n <= total; n++ {
				_, ifc, err := newIfc(n)
				if err == nil {
					ifc.Close()
					t.Fatalf("New succeeded although operation %d of %d failed", n, total)
				}
				if !errors.Is(err, errRVInjected) {
					t.Fatalf("operation %d: error %v does not wrap the injected failure", n, err)
				}
				rvCheckNoLeak(t, fmt.Sprintf("after failing operation %d of %d (%v)", n, total, err), base, fab.Stats())
			}
			t.Logf("%d failure points", total)
		})
	}
}

// rvCheckNoLeak compares the fabric's live objects with the baseline.
func rvCheckNoLeak(t *testing.T, when string, base, now soft.FabricStats) {
	t.Helper()
	type live struct{ QPs, CQs, SRQs, AHs, GSIQPs, Mcast int }
	b := live{base.QPs, base.CQs, base.SRQs, base.AHs, base.GSIQPs, base.McastAttachments}
	n := live{now.QPs, now.CQs, now.SRQs, now.AHs, now.GSIQPs, now.McastAttachments}
	if n != b {
		t.Fatalf("%s: live objects %+v, want %+v", when, n, b)
	}
}
