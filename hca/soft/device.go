package soft

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
)

// Device limits. MaxMsgSize is well above IPoIB-CM's 65524.
const (
	maxQP      = 1 << 16
	maxQPWR    = 1 << 14
	maxCQE     = 1 << 20
	maxSRQWR   = 1 << 14
	maxMsgSize = 1 << 20
	maxAlloc   = 1 << 30
	// localCAACKDelay is rxe's RXE_LOCAL_CA_ACK_DELAY (4.096 us * 2^15).
	localCAACKDelay = 15

	firstQPN       hca.QPN = 0x10
	defaultQueueWR         = 256
)

// Device is one soft HCA with a single port. It implements hca.Device.
type Device struct {
	f    *Fabric
	name string
	gid  hca.GID

	// pkeyViolations counts packets this port dropped for their P_Key.
	pkeyViolations atomic.Uint64
	// udNoBuffer counts UD deliveries to this port that found no receive
	// buffer (also in the fabric's UDDrops.NoBuffer).
	udNoBuffer atomic.Uint64

	// All fields below are guarded by f.mu.
	pkeys    []hca.PKey
	linkUp   bool
	closed   bool
	qps      map[hca.QPN]*qp
	nextQPN  hca.QPN
	freed    []hca.QPN // just-freed QPNs, reused first under ImmediateQPNReuse
	gsi      *qp
	cqs      map[*cq]struct{}
	srqs     map[*srq]struct{}
	ahs      map[*ah]struct{}
	handlers map[uint64]func(hca.AsyncEvent)
	nextH    uint64
	mcast    deviceMcast
}

var _ hca.Device = (*Device)(nil)

func newDevice(f *Fabric, name string, gid hca.GID) *Device {
	return &Device{
		f:        f,
		name:     name,
		gid:      gid,
		pkeys:    []hca.PKey{f.cfg.PKey},
		linkUp:   true,
		qps:      make(map[hca.QPN]*qp),
		nextQPN:  firstQPN,
		cqs:      make(map[*cq]struct{}),
		srqs:     make(map[*srq]struct{}),
		ahs:      make(map[*ah]struct{}),
		handlers: make(map[uint64]func(hca.AsyncEvent)),
	}
}

// Name returns the device name given to NewDevice.
func (d *Device) Name() string { return d.name }

// GID returns the port GID.
func (d *Device) GID() hca.GID { return d.gid }

// Port returns the port attributes.
func (d *Device) Port() hca.Port {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	return hca.Port{
		GID:       d.gid,
		PKeys:     slices.Clone(d.pkeys),
		ActiveMTU: d.f.cfg.MTU,
		Active:    d.linkUp,

		PKeyViolations: d.pkeyViolations.Load(),
		UDNoBuffer:     d.udNoBuffer.Load(),
	}
}

// Limits returns the device capabilities.
func (d *Device) Limits() hca.Limits {
	return hca.Limits{MaxQP: maxQP, MaxQPWR: maxQPWR, MaxCQE: maxCQE, MaxSRQWR: maxSRQWR, MaxMsgSize: maxMsgSize,
		// A software HCA like rxe (RXE_LOCAL_CA_ACK_DELAY); with one port
		// its node GUID is its port GUID.
		LocalCAACKDelay: localCAACKDelay, NodeGUID: binary.BigEndian.Uint64(d.gid[8:]),
		Offloads: d.f.offloads()}
}

// SetPKeyTable replaces the port's P_Key table (index 0 first), as the
// subnet manager does, and raises EventPortPKeyChange. QPs keep the index
// they were given at Init and see the new value at that index.
func (d *Device) SetPKeyTable(table []hca.PKey) error {
	if len(table) == 0 {
		return fmt.Errorf("soft: %s: empty P_Key table: %w", d.name, hca.ErrInvalidArgument)
	}
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.Equal(d.pkeys, table) {
		return nil
	}
	d.pkeys = slices.Clone(table)
	if d.closed {
		return nil
	}
	for _, id := range sortedKeys(d.handlers) {
		f.event(d.handlers[id], hca.AsyncEvent{Type: hca.EventPortPKeyChange})
	}
	return nil
}

// pkeyAt is the P_Key at index i, or 0 (matching nothing) if out of range.
func (d *Device) pkeyAt(i int) hca.PKey {
	if i < 0 || i >= len(d.pkeys) {
		return 0
	}
	return d.pkeys[i]
}

// SetLinkUp changes the port state and raises PORT_ACTIVE or PORT_ERR.
// While down, RC sends from or to this port fail through the transport
// retry path and UD traffic from or to it is dropped.
func (d *Device) SetLinkUp(up bool) {
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if d.closed || d.linkUp == up {
		return
	}
	d.linkUp = up
	ev := hca.AsyncEvent{Type: hca.EventPortErr}
	if up {
		ev.Type = hca.EventPortActive
	}
	for _, id := range sortedKeys(d.handlers) {
		f.event(d.handlers[id], ev)
	}
}

func sortedKeys[V any](m map[uint64]V) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// OnPortEvent registers fn for PORT_ACTIVE / PORT_ERR / PKEY_CHANGE.
func (d *Device) OnPortEvent(fn func(hca.AsyncEvent)) (cancel func()) {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	d.nextH++
	id := d.nextH
	d.handlers[id] = fn
	return func() {
		d.f.mu.Lock()
		delete(d.handlers, id)
		d.f.mu.Unlock()
	}
}

// Alloc returns zeroed memory. The soft fabric copies through ordinary Go
// memory, so registration is bookkeeping only.
// TODO: record the regions and reject work requests outside them.
func (d *Device) Alloc(size int) ([]byte, error) {
	if size <= 0 || size > maxAlloc {
		return nil, fmt.Errorf("soft: %s: alloc %d bytes: %w", d.name, size, hca.ErrInvalidArgument)
	}
	d.f.mu.Lock()
	closed := d.closed
	d.f.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("soft: %s: alloc: %w", d.name, hca.ErrDestroyed)
	}
	return make([]byte, size), nil
}

// CreateAH makes an address handle for dgid.
func (d *Device) CreateAH(dgid hca.GID) (hca.AH, error) {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("soft: %s: create AH: %w", d.name, hca.ErrDestroyed)
	}
	a := &ah{dev: d, dgid: dgid}
	d.ahs[a] = struct{}{}
	d.f.live.ahs++
	return a, nil
}

// allocQPN picks a QPN not used by a live QP of d; under f.mu.
func (d *Device) allocQPN() (hca.QPN, error) {
	if len(d.qps) >= maxQP {
		return 0, hca.ErrNoResources
	}
	if d.f.faults.ImmediateQPNReuse {
		for len(d.freed) > 0 {
			n := d.freed[len(d.freed)-1]
			d.freed = d.freed[:len(d.freed)-1]
			if _, used := d.qps[n]; !used {
				return n, nil
			}
		}
	}
	for {
		n := d.nextQPN
		d.nextQPN++
		if d.nextQPN > hca.QPNMask-1 { // 0xFFFFFF is the multicast QPN
			d.nextQPN = firstQPN
		}
		if _, used := d.qps[n]; !used {
			return n, nil
		}
	}
}

// Close destroys every object left on the device and removes it from the
// fabric.
func (d *Device) Close() error {
	f := d.f
	f.mu.Lock()
	if d.closed {
		f.mu.Unlock()
		return nil
	}
	qps := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	slices.SortFunc(qps, func(a, b *qp) int { return int(a.qpn) - int(b.qpn) })
	for _, q := range qps {
		for q.mcast.Len() > 0 {
			_ = f.detachLocked(q, q.mcast.All()[0]) // attached: cannot fail
		}
		f.destroyQPLocked(q)
	}
	for s := range d.srqs {
		f.destroySRQLocked(s)
	}
	for c := range d.cqs {
		f.destroyCQLocked(c)
	}
	for a := range d.ahs {
		a.destroyed = true
		delete(d.ahs, a)
		f.live.ahs--
	}
	d.closed = true
	clear(d.handlers)
	delete(f.devices, d.gid)
	delete(f.byName, d.name)
	f.mu.Unlock()
	return nil
}

// ah is a soft address handle.
type ah struct {
	dev       *Device
	dgid      hca.GID
	destroyed bool // under f.mu
}

func (a *ah) DGID() hca.GID { return a.dgid }

func (a *ah) Destroy() error {
	f := a.dev.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if a.destroyed {
		return fmt.Errorf("soft: destroy AH %s: %w", a.dgid, hca.ErrDestroyed)
	}
	a.destroyed = true
	delete(a.dev.ahs, a)
	f.live.ahs--
	return nil
}
