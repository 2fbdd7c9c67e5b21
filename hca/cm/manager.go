package cm

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// ErrClosed is returned by calls on a closed Manager.
var ErrClosed = errors.New("cm: manager closed")

// ErrServiceIDInUse is returned by Listen for a service ID already taken.
var ErrServiceIDInUse = errors.New("cm: service ID already listened on")

// ErrInvalidState is wrapped when a Conn method does not fit its state.
var ErrInvalidState = errors.New("cm: operation not allowed in connection state")

// remoteKey identifies a connection by what its peer calls it: REQs are
// demultiplexed by it.
type remoteKey struct {
	commID uint32
	gid    hca.GID
}

// qpnKey identifies a remote QP; a second connection from it is stale.
type qpnKey struct {
	qpn hca.QPN
	gid hca.GID
}

// pendingEvent is an event waiting for delivery outside the lock; after,
// if set, runs once the handler returned (the RTU after EventREPReceived).
type pendingEvent struct {
	ev    Event
	after func()
}

// Manager is the CM of one hca.Device: it owns the device's GSI QP.
type Manager struct {
	dev    hca.Device
	opts   Options
	log    *slog.Logger
	gid    hca.GID
	caGUID uint64 // the node GUID, as cm_format_req and cm_format_rep send
	// ackDelay is the device's Local CA ACK Delay (cm_add_one).
	ackDelay uint8
	// cancelPort ends the subscription that keeps pkeys current.
	cancelPort func()

	cq      hca.CQ
	qp      hca.QP
	sendBuf []byte // QueueDepth slots of MADSize
	recvBuf []byte // QueueDepth slots of recvSlotSize

	wake chan struct{} // CQ event or events to deliver
	done chan struct{}
	wg   sync.WaitGroup

	// Owned by the run goroutine only.
	wcs []hca.WC
	// slotPKey is the P_Key each receive slot's MAD arrived with.
	slotPKey []hca.PKey
	recvWRs  []hca.RecvWR
	backlog  backlog // received MADs waiting, per source (backlog.go)
	rx       struct {
		req  REQ
		rep  REP
		rtu  RTU
		rej  REJ
		mra  MRA
		dreq DREQ
		drep DREP
	}

	mu     sync.Mutex
	closed bool
	// pkeys is the port's P_Key table, refreshed on PKEY_CHANGE: MADs
	// go out with the index of their connection's partition in it.
	pkeys []hca.PKey
	// rxPKey is the P_Key of the MAD being handled: answers that belong
	// to no connection go back in its partition (cm_init_av_for_response).
	rxPKey      hca.PKey
	rng         *rand.Rand
	nextTID     uint64
	conns       map[uint32]*Conn // by local comm ID
	byRemote    map[remoteKey]*Conn
	byRemoteQPN map[qpnKey]*Conn // established passive connections
	listeners   map[uint64]*Listener
	// halfOpen holds the passive connections not yet verified, per
	// remote GID (halfopen.go); halfOpenCount is their total.
	halfOpen      map[hca.GID]*halfOpenSet
	halfOpenCount int
	halfOpenSeq   uint64
	ahs           ahCache
	freeSlots     []uint32
	deadlines     deadlines
	timer         *time.Timer
	timerAt       time.Time
	timerArmed    bool
	pending       []pendingEvent
	pendingHead   int
	stats         counters
	scratch       [MADSize]byte
	sendWR        [1]hca.SendWR
}

// recvSlotSize leaves room past a MAD so an oversized message completes
// with its true length (and is dropped as long) instead of a length error.
const recvSlotSize = MADSize + 64

// Parameters the CM puts in QP attributes and REQs that the consumer does
// not choose.
const (
	// minRNRTimer is what cm_init_qp_rtr_attr gives every RC QP (code 0,
	// 655 ms); IPoIB does not change it.
	minRNRTimer = 0
	// hopLimit is the REQ's primary path hop limit: over RoCEv2 the IP
	// TTL of the route, which rdma_cm copies into the path (64 from the
	// default route). Being above 1 it makes the path routed in
	// cm_format_req's terms: Subnet Local 0 and permissive LIDs.
	hopLimit = 64
	// lidPermissive is IB_LID_PERMISSIVE, cm_format_req's LIDs for a
	// routed path.
	lidPermissive = 0xFFFF
)

// NewManager creates the GSI QP on dev and starts the Manager's goroutine.
func NewManager(dev hca.Device, opts Options) (*Manager, error) {
	opts = opts.withDefaults(dev.Limits().MaxQPWR)
	port := dev.Port()
	lim := dev.Limits()
	m := &Manager{
		dev:         dev,
		opts:        opts,
		log:         opts.Logger,
		gid:         port.GID,
		caGUID:      lim.NodeGUID,
		ackDelay:    lim.LocalCAACKDelay & 0x1F,
		pkeys:       port.PKeys,
		wake:        make(chan struct{}, 1),
		done:        make(chan struct{}),
		wcs:         make([]hca.WC, 64),
		rng:         rand.New(rand.NewPCG(uint64(opts.Seed), 0x636d)),
		conns:       make(map[uint32]*Conn),
		byRemote:    make(map[remoteKey]*Conn),
		byRemoteQPN: make(map[qpnKey]*Conn),
		listeners:   make(map[uint64]*Listener),
		halfOpen:    make(map[hca.GID]*halfOpenSet),
		ahs:         newAHCache(maxCachedAHs),
	}
	if len(m.pkeys) == 0 {
		m.pkeys = []hca.PKey{hca.PKeyDefault}
	}
	if m.caGUID == 0 {
		// A device that reports no node GUID: its port GUID names it.
		m.caGUID = binary.BigEndian.Uint64(port.GID[8:])
	}
	m.stats.rejSent = make(map[RejectReason]uint64)
	m.stats.rejReceived = make(map[RejectReason]uint64)
	// Linux keeps the high half of the TID per MAD agent; a random one
	// keeps TIDs of a restarted Manager apart from its predecessor's.
	m.nextTID = uint64(m.rng.Uint32()) << 32
	if err := m.setupGSI(); err != nil {
		m.teardownGSI()
		return nil, err
	}
	m.cancelPort = dev.OnPortEvent(m.onPortEvent)
	m.timer = time.NewTimer(time.Hour)
	m.timer.Stop()
	m.wg.Add(1)
	go m.run()
	return m, nil
}

// Close stops the Manager's goroutine and destroys the GSI QP, CQ and
// address handles. It sends nothing: connections vanish as if the host
// crashed (call Conn.Destroy first for a clean DREQ). No event is
// delivered after Close returns.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.done)
	m.wg.Wait()
	m.cancelPort()
	m.timer.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conns {
		c.state = StateIdle
		c.handler = nil
	}
	clear(m.conns)
	clear(m.byRemote)
	clear(m.byRemoteQPN)
	clear(m.halfOpen)
	m.halfOpenCount = 0
	m.deadlines = nil
	return m.teardownGSI()
}

// Stats returns a snapshot of the counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats.snapshot()
	s.LiveConns = len(m.conns)
	s.HalfOpen = m.halfOpenCount
	s.MaxHalfOpen = m.opts.MaxHalfOpen
	s.MaxHalfOpenPerGID = m.opts.MaxHalfOpenPerGID
	s.Listeners = len(m.listeners)
	return s
}

// onPortEvent keeps the P_Key table current (IB_EVENT_PKEY_CHANGE).
func (m *Manager) onPortEvent(ev hca.AsyncEvent) {
	if ev.Type != hca.EventPortPKeyChange {
		return
	}
	pkeys := m.dev.Port().PKeys
	if len(pkeys) == 0 {
		return
	}
	m.mu.Lock()
	m.pkeys = pkeys
	m.mu.Unlock()
}

// GID is the device GID the Manager uses as its local and primary GID.
func (m *Manager) GID() hca.GID { return m.gid }

// run is the Manager's goroutine: completions, timers, event delivery.
func (m *Manager) run() {
	defer m.wg.Done()
	for {
		select {
		case <-m.done:
			return
		case <-m.wake:
			m.pollCQ()
		case <-m.timer.C:
			m.mu.Lock()
			m.expire()
			m.mu.Unlock()
		}
		m.deliver()
	}
}

// kick wakes the run goroutine. It never blocks.
func (m *Manager) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// queue schedules ev for delivery on the run goroutine. m.mu must be held.
func (m *Manager) queue(ev Event, after func()) {
	m.pending = append(m.pending, pendingEvent{ev: ev, after: after})
	m.kick()
}

// deliver runs the handlers of queued events, without the lock, in order.
func (m *Manager) deliver() {
	for {
		m.mu.Lock()
		if m.closed || m.pendingHead == len(m.pending) {
			clear(m.pending)
			m.pending, m.pendingHead = m.pending[:0], 0
			m.mu.Unlock()
			return
		}
		p := m.pending[m.pendingHead]
		m.pending[m.pendingHead] = pendingEvent{}
		m.pendingHead++
		h := p.ev.Conn.handler
		m.mu.Unlock()
		if h != nil {
			h(p.ev)
		}
		if p.after != nil {
			p.after()
		}
	}
}

// newLocalCommID draws a random, non-zero, unused local comm ID.
// m.mu must be held.
func (m *Manager) newLocalCommID() uint32 {
	for {
		id := m.rng.Uint32()
		if _, used := m.conns[id]; id != 0 && !used {
			return id
		}
	}
}

// newTID returns a fresh transaction ID. m.mu must be held.
func (m *Manager) newTID() uint64 {
	m.nextTID++
	return m.nextTID
}

// forget removes c from every index; it becomes idle. m.mu must be held.
func (m *Manager) forget(c *Conn) {
	m.clearDeadline(c)
	if m.conns[c.localCommID] == c {
		delete(m.conns, c.localCommID)
	}
	if k := (remoteKey{c.remoteCommID, c.remoteGID}); m.byRemote[k] == c {
		delete(m.byRemote, k)
	}
	m.leaveEstablished(c)
	m.leaveHalfOpen(c)
	c.state = StateIdle
}

// leaveEstablished drops c from the stale-detection index. m.mu must be
// held.
func (m *Manager) leaveEstablished(c *Conn) {
	if k := (qpnKey{c.remoteQPN, c.remoteGID}); m.byRemoteQPN[k] == c {
		delete(m.byRemoteQPN, k)
	}
}

func (m *Manager) checkOpen() error {
	if m.closed {
		return ErrClosed
	}
	return nil
}

func copyBytes(b []byte) []byte { return append([]byte(nil), b...) }
