package ipoibcm

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/internal/mutation"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/napi"
)

// ifState is the lifecycle of an Interface.
//
//go:generate go tool stringer -type=ifState -linecomment
type ifState int32

const (
	ifCreated ifState = iota // created
	ifRunning                // running
	ifClosing                // closing
	ifClosed                 // closed
)

// headroom is the room kept in front of every receive buffer so the 4-byte
// IPoIB header at offset headroom becomes the tail of a 14-byte Ethernet
// header written at offset 0: received packets reach the host without a
// copy. The same offset in a TX buffer turns the host's Ethernet header
// into the IPoIB header.
const headroom = frame.EthHdrLen - frame.EncapLen

// txBufSize fits the largest host frame plus one byte, so a frame the host
// port truncated to the buffer is recognisably oversize: a 64 KiB IP
// packet, the largest a TSO/USO super frame from an OffloadPort can be.
const txBufSize = 65535 + frame.EthHdrLen + 1

// Interface is one IPoIB interface (ib0): a UD QP on the broadcast group,
// RC connections through the CM, and the host port in front.
type Interface struct {
	cfg  Config
	dev  hca.Device
	host HostPort
	log  *slog.Logger

	port  hca.Port
	udMTU int
	hw    frame.HWAddr
	// hostMAC is the host's MAC: the destination of every frame written
	// to the host, which the host may change at run time (FollowHostMAC).
	hostMAC macCell
	bcast   hca.GID

	mode atomic.Int32 // Mode
	mtu  atomic.Int64
	link atomic.Bool
	life ifStateCell // created, running, closing, closed

	rxCQ, txCQ hca.CQ
	rxNAPI     *napi.Context // the RX poller; its poll lock orders the dead flag
	ud         *udPath
	srq        *srqRing // nil without SRQ
	cmm        *cm.Manager
	// listener is the CM listener while the host has ib0 up; closed and
	// nil while it is down (hostlink.go). listenerMu guards the pointer:
	// Close reads it on its own goroutine.
	listenerMu sync.Mutex
	listener   *cm.Listener
	// hostLink is the host's ib0 state the engine follows (hostLink,
	// hostlink.go); downQuiet: while down, the last connection is gone
	// (control loop).
	hostLink  hostLinkCell
	downQuiet bool

	// The two data flows: host → TX path → HCA and HCA → RX path → host.
	tx  txPath
	rx  rxPath      // owned by the RX poller
	off offloadPath // offloads.go
	// queues are the host port's queues, each with its reader's state
	// and its writer (hostqueue.go); hostOut are their writers.
	queues  []*hostQueue
	hostOut hostWriters

	// mu orders the host's link changes with the multicast joins and
	// leaves and the path flush that follow them (linkUp, hostlink.go):
	// Start's linkUp runs on its caller's goroutine, the rest on the
	// control loop. Every owner has its own lock, taken inside it; never
	// held across napi Sync or CM calls that may wait for the CM
	// goroutine.
	mu      sync.Mutex
	neigh   neighbourTable // neighbour.go
	mcast   mcastTable
	active  activeSet  // the active connections (txconn.go)
	passive passiveSet // the passive connections (rxteardown.go)
	psn     *psnSource // the UD QP's and the REPs' starting PSNs

	ctl  control
	obs  observer // Config.Events
	shut shutdown // Close's, on the control loop
	// hostMTUStale: the last mode switch could not set the host's MTU
	// (control loop), so SetMode to the same mode tries again.
	hostMTUStale bool

	// mut are the soak's mutations (internal/mutation), found on the
	// device; the zero value everywhere else.
	mut mutation.Soak

	ctr         counters
	ifCtr       interfaceCounters
	hostLinkCtr hostLinkCounters // hostlink.go

	stop     chan struct{} // closed by Close: reader and control loop end
	readerWG sync.WaitGroup
	closeErr error
	closeMu  sync.Mutex

	// Partition state, behind the data path's fields so adding it moved
	// none of them. pkeyIndex is the port table's index of the
	// interface's partition: every QP's P_Key index. pkeyActive: the UD
	// QP is up on it (the P_Key was in the table at New or has appeared
	// since). Both are written at New and by the control loop.
	pkeyIndex  int
	pkeyActive bool
	// pkeyHere: the P_Key is at pkeyIndex now (control loop).
	pkeyHere bool
	// cancelPort ends the PKEY_CHANGE subscription.
	cancelPort func()
	ownCM      bool // cmm is ours to close (not Config.CMManager)

	// parent is the Interface whose device and CM this child shares; nil
	// for a parent (child.go).
	parent   *Interface
	children childSet
}

// New creates an Interface: its CQs, UD QP, SRQ and buffers, and the CM
// manager. Nothing runs until Start.
func New(cfg Config) (_ *Interface, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	i := &Interface{
		cfg:  cfg,
		dev:  cfg.Device,
		host: cfg.Host,
		log:  cfg.Logger.With("if", cfg.Name),
		port: cfg.Device.Port(),
		psn:  newPSNSource(cfg.CM.Seed),
		stop: make(chan struct{}),
		obs:  observer{cfg.Events},
	}
	i.tx = txPath{sendq: cfg.SendQueueSize, stop: i.stop, data: &i.ctr, offCtr: &i.off.ctr, hostMAC: i.hostMAC.load}
	i.off.init(cfg.Host, cfg.Device, cfg.SendQueueSize)
	i.queues = newHostQueues(cfg.Host, i.off.port, &i.ctr, &i.life, i.log)
	i.tx.windows.log = i.log
	for _, q := range i.queues {
		i.tx.gates = append(i.tx.gates, &q.gate)
		i.tx.windows.ws = append(i.tx.windows.ws, &q.window)
		i.hostOut = append(i.hostOut, &q.out)
	}
	i.ctl.init()
	if c, ok := cfg.Device.(mutation.Carrier); ok {
		i.mut = c.SoakMutations()
	}
	if !i.port.ActiveMTU.Valid() {
		return nil, fmt.Errorf("%s: port MTU %d: %w", cfg.Name, i.port.ActiveMTU, hca.ErrInvalidArgument)
	}
	i.pkeyIndex, i.pkeyActive = i.port.PKeyIndex(cfg.PKey)
	i.pkeyHere = i.pkeyActive
	if !i.pkeyActive {
		// ipoib_pkey_dev_check_presence: the interface exists, its link
		// stays down until a PKEY_CHANGE brings the P_Key in.
		i.log.Warn("P_Key not in the port's table: link down until it appears", "pkey", fmt.Sprintf("%#04x", uint16(cfg.PKey)), "table", fmt.Sprintf("%#04x", i.port.PKeys))
	}
	i.udMTU = frame.UDMTU(i.port.ActiveMTU)
	i.bcast = frame.BroadcastMGID(cfg.PKey)
	i.mcast.init(&i.cfg, i.dev, i.bcast, i.hostLink.down, i.log)
	i.mcast.retire = i.tx.windows.retire
	i.neigh.init(&i.cfg, i.port.GID, i.port.ActiveMTU, i.dev, i.tx.windows.retire, i.log, i.ctl.post)
	var hm frame.MAC
	copy(hm[:], cfg.Host.HostMAC())
	i.hostMAC.store(hm)
	i.mode.Store(int32(cfg.Mode))
	i.mtu.Store(int64(i.modeMTU(cfg.Mode)))

	defer func() {
		if err != nil {
			i.destroyResources()
		}
	}()
	if err := i.createQueues(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	flags := byte(0)
	if !cfg.DisableCM {
		flags = frame.FlagRC
		if i.cmm = cfg.CMManager; i.cmm == nil {
			m, err := cm.NewManager(cfg.Device, cfg.CM)
			if err != nil {
				return nil, fmt.Errorf("%s: cm manager: %w", cfg.Name, err)
			}
			i.cmm, i.ownCM = m, true
		}
	}
	i.hw = frame.NewHWAddr(flags, i.ud.qp.QPN(), i.port.GID)
	i.active.init(i)
	i.passive.init(passiveEnv{
		neigh: &i.neigh, psn: i.psn, dev: i.dev, cq: i.rxCQ, srq: i.srq, poller: i.rxNAPI, post: i.ctl.post,
		life: &i.life, hostLink: &i.hostLink,
		portMTU: i.port.ActiveMTU, udQPN: i.ud.qp.QPN(), obs: i.obs, mut: i.mut, log: i.log,
	}, &i.cfg)
	i.shut = shutdown{drainTimeout: cfg.DrainTimeout, rx: &i.passive, tx: &i.active, log: i.log}
	if err := i.rx.init(rxEnv{
		poller: i.rxNAPI, mu: &i.neigh.mu, neigh: &i.neigh, passive: &i.passive, post: i.ctl.post,
		out: newHostSplit(i.hostOut), off: &i.off, ctr: &i.ctr, ud: i.ud, srq: i.srq,
		hostMAC: &i.hostMAC, hostLink: &i.hostLink, self: i.hw, staleUpdate: cfg.StaleUpdate, log: i.log,
	}, cfg.RXBudget); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	return i, nil
}

// rxCQSize is Linux's recv_cq size (docs/linux.md §4.3): the UD ring
// plus one, the sends of passive QPs (the drain WR) bounded by the send
// queue, and the SRQ at its largest (srq.go) plus one spare for the
// drain completion, or every non-SRQ ring.
func rxCQSize(udRecvq, recvq, maxSRQ, sendq int, srq bool, maxConn int) int {
	n := udRecvq + 1 + sendq
	if srq {
		return n + maxSRQ + 1
	}
	return n + recvq*maxConn
}

func (i *Interface) createQueues() error {
	cfg := &i.cfg
	useSRQ := !cfg.DisableSRQ && !cfg.DisableCM
	var err error
	i.rxCQ, err = i.dev.CreateCQ(hca.CQConfig{
		Size:         rxCQSize(cfg.UDRecvQueueSize, cfg.RecvQueueSize, cfg.MaxRecvQueueSize, cfg.SendQueueSize, useSRQ, cfg.MaxNonSRQConns),
		OnCompletion: func() { i.rxNAPI.Schedule() },
		// Schedule never blocks and takes no lock: safe to run inside
		// a poster's verb call, which saves a goroutine hand-off per
		// event on the soft fabric.
		InlineCompletion: true,
		OnEvent:          i.onCQEvent,
	})
	if err != nil {
		return fmt.Errorf("create RX CQ: %w", err)
	}
	i.txCQ, err = i.dev.CreateCQ(hca.CQConfig{
		Size:             cfg.SendQueueSize,
		OnCompletion:     func() { i.tx.napi.Schedule() },
		InlineCompletion: true,
		OnEvent:          i.onCQEvent,
	})
	if err != nil {
		return fmt.Errorf("create TX CQ: %w", err)
	}
	// The RX handler sees a whole budget per call: GRO coalesces (and the
	// host gets one write) per handleRX, as Linux's GRO flushes per NAPI
	// poll, so a 16-completion batch would cut most 64 KiB LSO sends in two;
	// a poll that uses its whole budget keeps its open chains for the
	// next, until one completes (rxPath.complete).
	i.rxNAPI, err = napi.New(napi.Config{Name: cfg.Name + "-rx", CQ: i.rxCQ, Budget: cfg.RXBudget, Batch: cfg.RXBudget, Handle: i.rx.handleRX, Complete: i.rx.complete, Inline: cfg.InlineRX})
	if err != nil {
		return fmt.Errorf("rx napi: %w", err)
	}
	i.tx.napi, err = napi.New(napi.Config{Name: cfg.Name + "-tx", CQ: i.txCQ, Budget: cfg.TXBudget, Handle: i.tx.handleTX})
	if err != nil {
		return fmt.Errorf("tx napi: %w", err)
	}
	if i.ud, err = newUDPath(i); err != nil {
		return err
	}
	i.mcast.qp, i.tx.ud = i.ud.qp, i.ud.qp
	if useSRQ {
		if i.srq, err = newSRQRing(i); err != nil {
			return err
		}
	}
	if i.passive.drainBuf, err = i.dev.Alloc(64); err != nil {
		return fmt.Errorf("drain buffer: %w", err)
	}
	// Every reader may hold a batch of buffers while it waits to read.
	if i.tx.pool, err = newTXPool(i.dev, cfg.SendQueueSize+len(i.queues)*i.host.BatchSize(), txBufSize); err != nil {
		return err
	}
	return nil
}

func (i *Interface) onCQEvent(ev hca.AsyncEvent) {
	// A CQ overflow loses a completion; the sizing rule should make it
	// impossible, so it is logged loudly and counted.
	i.ifCtr.cqErrors.Add(1)
	i.log.Error("completion queue error", "event", ev.Type)
}

// interfaceCounters are the Interface's own: CQ errors and mode switches.
type interfaceCounters struct {
	cqErrors, modeSwitches atomic.Uint64
}

// Start brings the interface up: pollers, control loop, host reader, the
// CM listener, and the broadcast group; the link goes up once the UD QP is
// attached to the broadcast MGID.
func (i *Interface) Start() error {
	if !i.life.cas(ifCreated, ifRunning) {
		if i.life.running() {
			return ErrAlreadyStarted
		}
		return ErrClosed
	}
	i.rxNAPI.Start()
	i.tx.napi.Start()
	// The aging task gets the owners it ages, not the Interface.
	neigh, active, passive, mcast := &i.neigh, &i.active, &i.passive, &i.mcast
	i.ctl.start(controlTasks{
		staleScan: periodic{i.cfg.StaleScan, i.passive.staleScan},
		age: periodic{max(min(i.cfg.NeighbourTimeout, i.cfg.McastSendOnlyTimeout)/2, time.Millisecond), func(now time.Time) {
			neigh.age(now, active, passive)
			mcast.age(now)
		}},
		shutdown: &i.shut,
		after:    []func(){i.shut.check, i.checkHostDownQuiet},
	})
	if err := i.listen(); err != nil {
		i.Close()
		return fmt.Errorf("%s: %w", i.cfg.Name, err)
	}
	i.cancelPort = i.dev.OnPortEvent(func(ev hca.AsyncEvent) {
		if ev.Type == hca.EventPortPKeyChange {
			i.ctl.post(i.onPKeyChange)
		}
	})
	if i.pkeyActive {
		if err := i.linkUp(); err != nil {
			i.Close()
			return fmt.Errorf("%s: %w", i.cfg.Name, err)
		}
	} else if err := i.host.SetLinkUp(false); err != nil {
		i.log.Warn("host SetLinkUp", "err", err)
	}
	for _, q := range i.queues {
		i.readerWG.Add(1)
		go newHostReader(i, q).run(i.readerWG.Done)
	}
	i.log.Info("up", "hwaddr", i.hw, "mode", i.Mode(), "mtu", i.MTU())
	return nil
}

// linkUp joins the broadcast and default groups and raises the link: at
// Start, or on the control loop once the P_Key is (back) in the table.
func (i *Interface) linkUp() error {
	i.mu.Lock()
	err := i.mcast.joinDefaults(time.Now())
	i.mu.Unlock()
	if err != nil {
		return err
	}
	if err := i.host.SetMTU(i.MTU()); err != nil {
		i.log.Warn("host SetMTU", "err", err)
	}
	i.off.advertise(i.Mode(), i.log)
	if h, ok := i.host.(linkLocalSetter); ok {
		if err := h.SetLinkLocal(LinkLocal(i.port.GID)); err != nil {
			i.log.Warn("host SetLinkLocal", "err", err)
		}
	}
	i.link.Store(true)
	if err := i.host.SetLinkUp(true); err != nil {
		i.log.Warn("host SetLinkUp", "err", err)
	}
	return nil
}

// onPKeyChange follows the subnet manager's rewrite of the P_Key table
// (control loop), as ipoib's PKEY_CHANGE flush: a P_Key that appeared
// brings the UD QP up on its index and the link up; one that left the
// index the QPs were made with takes the link down (carrier off, TX
// connections flushed) until it is back there. The QPs keep their index
// (IBA: a QP holds an index, not a value), so a P_Key that reappears at
// another index leaves the link down: the interface must be recreated.
// While the host has ib0 down the link stays down whatever the table
// says; openForHost raises it only with the P_Key here.
func (i *Interface) onPKeyChange() {
	if !i.life.running() || i.shut.active {
		return
	}
	port := i.dev.Port()
	idx, found := port.PKeyIndex(i.cfg.PKey)
	pkey := fmt.Sprintf("%#04x", uint16(i.cfg.PKey))
	if !i.pkeyActive {
		if !found {
			return
		}
		if err := i.ud.activate(idx); err != nil {
			i.log.Error("P_Key appeared, UD QP not brought up", "pkey", pkey, "err", err)
			return
		}
		i.pkeyIndex, i.pkeyActive = idx, true
	}
	here := i.pkeyIndex < len(port.PKeys) && port.PKeys[i.pkeyIndex]&^0x8000 == i.cfg.PKey&^0x8000
	if here == i.pkeyHere {
		return
	}
	i.pkeyHere = here
	switch {
	case here:
		i.log.Info("P_Key in the port's table", "pkey", pkey, "index", i.pkeyIndex)
		if !i.hostLink.down() {
			if err := i.linkUp(); err != nil {
				i.log.Error("link up", "err", err)
			}
		}
	case found:
		i.log.Warn("P_Key moved in the port's table; the interface's QPs stay on their index: recreate it", "pkey", pkey, "from", i.pkeyIndex, "to", idx)
		i.pkeyLinkDown()
	default:
		i.log.Warn("P_Key left the port's table: link down until it is back", "pkey", pkey, "index", i.pkeyIndex)
		i.pkeyLinkDown()
	}
}

// pkeyLinkDown takes the link down for a departed P_Key (control loop):
// carrier off, so the host stops sending, and the TX connections torn
// down; passive ones end with their peers' retries.
func (i *Interface) pkeyLinkDown() {
	if i.hostLink.down() {
		return
	}
	i.link.Store(false)
	if err := i.host.SetLinkUp(false); err != nil {
		i.log.Warn("host SetLinkUp", "err", err)
	}
	i.active.teardownAll()
}

// Mode is the current mode.
func (i *Interface) Mode() Mode { return Mode(i.mode.Load()) }

// MTU is the current IP MTU the host is told.
func (i *Interface) MTU() int { return int(i.mtu.Load()) }

// HWAddr is the interface's 20-byte hardware address.
func (i *Interface) HWAddr() frame.HWAddr { return i.hw }

// LinkUp reports whether the broadcast group is joined and the
// interface running.
func (i *Interface) LinkUp() bool { return i.link.Load() }

// Name is the configured name.
func (i *Interface) Name() string { return i.cfg.Name }

// SetMode switches mode at run time: every TX connection is flushed, the
// MTU follows the mode and the host is told. Traffic continues.
//
// If the host port refuses the new MTU the switch stands (mode and MTU are
// the new ones; packets above the new MTU are answered with ICMP
// frag-needed / packet-too-big, so the host's PMTU discovery copes) and
// SetMode returns an error wrapping both ErrHostMTUNotUpdated and the host
// port's error. Calling SetMode again with the same mode retries the MTU.
func (i *Interface) SetMode(m Mode) error {
	if m != ModeDatagram && m != ModeConnected {
		return fmt.Errorf("%s: set mode %d: %w", i.cfg.Name, int(m), ErrInvalidMode)
	}
	if m == ModeConnected && i.cfg.DisableCM {
		return fmt.Errorf("%s: connected mode without CM: %w", i.cfg.Name, ErrInvalidMode)
	}
	return i.onControlLoop("set mode", func() error { return i.switchMode(m) })
}

// onControlLoop runs fn on the control loop, where mode switches and the
// host's changes are ordered with each other, and returns its error once
// it has run.
func (i *Interface) onControlLoop(what string, fn func() error) error {
	if !i.life.running() {
		return fmt.Errorf("%s: %s: %w", i.cfg.Name, what, ErrNotStarted)
	}
	errc := make(chan error, 1)
	i.ctl.post(func() { errc <- fn() })
	select {
	case err := <-errc:
		return err
	case <-i.stop:
		return ErrClosed
	}
}

// psnSource draws the starting PSNs of the UD QP's send queue (New, and
// again when a P_Key appears, on the control loop) and of our REPs (the
// CM goroutine), so it has its own lock, a leaf: nothing is called while
// it is held.
type psnSource struct {
	mu  sync.Mutex
	rng *rand.Rand
}

// newPSNSource draws the starting PSNs. Seed 0 means random, as the CM
// takes it: Linux uses get_random_u32, and two processes that restart
// with the same PSNs would let a stale packet from a previous
// incarnation land in sequence. A non-zero seed makes tests
// reproducible.
func newPSNSource(seed int64) *psnSource {
	if seed == 0 {
		return &psnSource{rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	}
	return &psnSource{rng: rand.New(rand.NewPCG(uint64(seed), 0x1b1b))}
}

// next is a 24-bit starting PSN.
func (s *psnSource) next() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Uint32() & 0xffffff
}

// ifStateCell holds the Interface's ifState: stored by Start and Close,
// loaded by every goroutine. The owners that must know whether the
// interface runs (the passive set refusing REQs, the active set, the
// host writer) get the cell, not the Interface.
type ifStateCell struct{ v atomic.Int32 }

func (c *ifStateCell) load() ifState   { return ifState(c.v.Load()) }
func (c *ifStateCell) store(s ifState) { c.v.Store(int32(s)) }

// cas moves the state from from to to, if it is from.
func (c *ifStateCell) cas(from, to ifState) bool {
	return c.v.CompareAndSwap(int32(from), int32(to))
}

// running reports whether the interface is running: started, not closing.
func (c *ifStateCell) running() bool { return c.load() == ifRunning }
