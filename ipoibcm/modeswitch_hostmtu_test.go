package ipoibcm

import (
	"errors"
	"sync/atomic"
	"testing"
)

var errRVSetMTU = errors.New("host refuses the MTU")

// rvMTUFailPort is a memPort whose SetMTU fails while fail is set.
type rvMTUFailPort struct {
	*memPort
	fail atomic.Bool
}

func (p *rvMTUFailPort) SetMTU(mtu int) error {
	if p.fail.Load() {
		return errRVSetMTU
	}
	return p.memPort.SetMTU(mtu)
}

// A host that refuses the new MTU does not undo a mode switch: SetMode
// reports that the mode switched but the host MTU was not updated, and
// the same SetMode again retries the MTU.
func TestSetModeHostMTUFailureKeepsSwitch(t *testing.T) {
	fab := rvFabric(t, 40)
	port := &rvMTUFailPort{memPort: newMemPort(1, nil)}
	ifc := rvStart(t, fab, "a", port, nil)
	if got := port.mtu.Load(); got != 65520 {
		t.Fatalf("host MTU %d after Start", got)
	}

	port.fail.Store(true)
	err := ifc.SetMode(ModeDatagram)
	if !errors.Is(err, ErrHostMTUNotUpdated) || !errors.Is(err, errRVSetMTU) {
		t.Fatalf("SetMode = %v; want it to wrap ErrHostMTUNotUpdated and the host's error", err)
	}
	if ifc.Mode() != ModeDatagram || ifc.MTU() != 4092 {
		t.Fatalf("after the failed MTU update: mode %v, MTU %d; want datagram, 4092", ifc.Mode(), ifc.MTU())
	}
	if got := port.mtu.Load(); got != 65520 {
		t.Fatalf("host MTU changed to %d", got)
	}

	port.fail.Store(false)
	if err := ifc.SetMode(ModeDatagram); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := port.mtu.Load(); got != 4092 {
		t.Fatalf("host MTU %d after the retry, want 4092", got)
	}
	if n := ifc.Stats().Reaper.ModeSwitches; n != 1 {
		t.Fatalf("%d mode switches, want 1 (the retry only sets the MTU)", n)
	}
	// Nothing pending any more: the same mode again is a no-op.
	port.fail.Store(true)
	if err := ifc.SetMode(ModeDatagram); err != nil {
		t.Fatalf("no-op SetMode: %v", err)
	}
}
