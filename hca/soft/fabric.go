package soft

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// Fabric is a set of soft devices that reach each other. Create it with
// NewFabric and stop it with Close.
type Fabric struct {
	cfg Config

	// mu is the fabric lock: it guards devices, QPs, SRQs, multicast
	// groups, held completions, faults and rng. CQ rings have their own
	// lock, always taken inside mu. Its Unlock delivers inline completion
	// events.
	mu        fabricLock
	faults    Faults
	rng       *rand.Rand
	devices   map[hca.GID]*Device
	byName    map[string]*Device
	nextIndex uint32
	groups    map[hca.GID][]*qp
	live      liveCounts
	closed    bool

	// spuriousBits mirrors faults.SpuriousCompletionEvents for Notify,
	// which does not take mu.
	spuriousBits atomic.Uint64

	stats      counters
	disp       *dispatcher
	sched      *scheduler
	done       chan struct{}
	wg         sync.WaitGroup
	goroutines atomic.Int32
}

// liveCounts are the fabric's live object counts, under Fabric.mu.
type liveCounts struct {
	qps, cqs, srqs, ahs, gsi, mcast, held int
}

// NewFabric starts a fabric. Zero or out-of-range Config fields take
// their defaults (MTU 4096, P_Key 0xFFFF, TimerScale 1).
func NewFabric(cfg Config) *Fabric {
	c := cfg.withDefaults()
	f := &Fabric{
		cfg:     c,
		faults:  c.Faults,
		rng:     rand.New(rand.NewPCG(uint64(c.Seed), 0x9e3779b97f4a7c15)),
		devices: make(map[hca.GID]*Device),
		byName:  make(map[string]*Device),
		groups:  make(map[hca.GID][]*qp),
		disp:    newDispatcher(),
		sched:   newScheduler(),
		done:    make(chan struct{}),
	}
	f.spuriousBits.Store(math.Float64bits(c.Faults.SpuriousCompletionEvents))
	f.start(f.disp.run)
	f.start(f.sched.run)
	return f
}

func (f *Fabric) start(run func(done <-chan struct{})) {
	f.wg.Add(1)
	f.goroutines.Add(1)
	go func() {
		defer f.wg.Done()
		defer f.goroutines.Add(-1)
		run(f.done)
	}()
}

// SetFaults replaces the fault-injection setting at run time.
func (f *Fabric) SetFaults(faults Faults) {
	f.mu.Lock()
	f.faults = faults
	f.mu.Unlock()
	f.spuriousBits.Store(math.Float64bits(faults.SpuriousCompletionEvents))
}

// Faults returns the current fault-injection setting.
func (f *Fabric) Faults() Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faults
}

// NewDevice adds a device with a unique GID (fe80::<index>) and the
// P_Key table {Config.PKey}. Names must be unique within the fabric.
func (f *Fabric) NewDevice(name string) (*Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var gid hca.GID
	gid[0], gid[1] = 0xfe, 0x80
	binary.BigEndian.PutUint32(gid[12:], f.nextIndex+1)
	d, err := f.newDeviceLocked(name, gid)
	if err != nil {
		return nil, err
	}
	// Only a device that came up takes an index, so GIDs stay dense.
	f.nextIndex++
	return d, nil
}

// NewDeviceWithGID adds a device with a chosen port GID, which must not be
// in use by a live device: a host that restarts on the same port (its old
// device closed, the new one with fresh QPNs), which is what an IPoIB peer
// must survive without the host's ARP cache changing.
func (f *Fabric) NewDeviceWithGID(name string, gid hca.GID) (*Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newDeviceLocked(name, gid)
}

// newDeviceLocked checks that the fabric is open and that name and gid are
// free, then adds the device; both NewDevice and NewDeviceWithGID end here.
func (f *Fabric) newDeviceLocked(name string, gid hca.GID) (*Device, error) {
	if f.closed {
		return nil, fmt.Errorf("soft: new device %q: fabric: %w", name, hca.ErrDestroyed)
	}
	if _, dup := f.byName[name]; dup || name == "" {
		return nil, fmt.Errorf("soft: new device %q: name empty or taken: %w", name, hca.ErrInvalidArgument)
	}
	if _, dup := f.devices[gid]; dup || gid.IsMulticast() {
		return nil, fmt.Errorf("soft: new device %q: GID %s in use or multicast: %w", name, gid, hca.ErrInvalidArgument)
	}
	d := newDevice(f, name, gid)
	f.devices[gid] = d
	f.byName[name] = d
	return d, nil
}

// Stats returns a snapshot of the fabric's counters.
func (f *Fabric) Stats() FabricStats {
	f.mu.Lock()
	s := FabricStats{
		Devices:           len(f.devices),
		QPs:               f.live.qps,
		CQs:               f.live.cqs,
		SRQs:              f.live.srqs,
		AHs:               f.live.ahs,
		GSIQPs:            f.live.gsi,
		McastAttachments:  f.live.mcast,
		PendingCompletion: f.live.held,
	}
	f.mu.Unlock()
	s.Goroutines = int(f.goroutines.Load())
	f.stats.fill(&s)
	return s
}

// Close closes every device and stops the fabric's goroutines; callbacks
// not yet delivered are dropped.
func (f *Fabric) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	devs := make([]*Device, 0, len(f.devices))
	for _, d := range f.devices {
		devs = append(devs, d)
	}
	f.mu.Unlock()
	for _, d := range devs {
		d.Close()
	}
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	close(f.done)
	f.wg.Wait()
	return nil
}

// chance draws against probability p; under f.mu.
func (f *Fabric) chance(p float64) bool {
	return p > 0 && f.rng.Float64() < p
}

// randDuration is uniform in [0, max]; under f.mu.
func (f *Fabric) randDuration(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(f.rng.Int64N(int64(max) + 1))
}

// event queues an asynchronous event for fn on the dispatcher.
func (f *Fabric) event(fn func(hca.AsyncEvent), ev hca.AsyncEvent) {
	if fn != nil {
		f.disp.post(notification{fn: fn, ev: ev})
	}
}
