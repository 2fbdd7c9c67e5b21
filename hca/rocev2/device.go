package rocev2

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/internal/core"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Device limits.
const (
	maxQP      = 1 << 16
	maxQPWR    = 1 << 14
	maxCQE     = 1 << 20
	maxSRQWR   = 1 << 14
	maxMsgSize = 1 << 20
	firstQPN   = 0x10 // like rxe: QPNs below are reserved, 1 is GSI
	// localCAACKDelay is rxe's RXE_LOCAL_CA_ACK_DELAY (4.096 us * 2^15,
	// 134 ms): a software HCA's acknowledgements wait on a scheduler.
	localCAACKDelay = 15
)

// randomFirstQPN is where a new device starts numbering its QPs: a random
// point of the 24-bit space rather than firstQPN, so a process that
// restarts on the same address (the same GID) does not hand out the QPNs
// of its previous life. Its peers tell a restarted port by its new UD QPN
// in the hardware address (a gratuitous ARP, a UD source, a REQ's
// private data) and replace their connections to the old QPs at once;
// with the old numbers they would keep sending to QPs that now belong to
// other connections, until the RC transport gave up (docs/linux.md, "A
// restarted peer").
func randomFirstQPN() hca.QPN {
	return firstQPN + hca.QPN(rand.N(uint32(hca.QPNMask-firstQPN)/2))
}

// Device is one RoCEv2 HCA bound to a UDP address. It implements
// hca.Device.
type Device struct {
	cfg Config
	gid hca.GID
	// nodeGUID is fixed at creation (see nodeGUIDFor).
	nodeGUID uint64
	local    netip.AddrPort
	sock     *udpSocket
	// psock, when set, receives the IPv4 datagrams instead of sock
	// (packetSocket); closed by Close.
	psock *packetSocket
	ctr   counters
	// srcPorts are the per-QP send sockets; guarded by mu.
	srcPorts *sourcePorts
	// maxPacket is the largest UDP payload the device sends or accepts.
	maxPacket int
	// Rate-limited warnings of datagrams lost to the underlay: refused by
	// the route (EMSGSIZE), other send errors, and received larger than
	// maxPacket (a peer with a larger IB MTU).
	warnTooBig, warnTx, warnRxTooBig rateLimitedWarn
	// allow is Config.Allow, replaced whole by SetAllow; the receive
	// path reads it without a lock.
	allow atomic.Pointer[[]netip.Prefix]

	// mu guards every verbs object of the device. Work that must run
	// outside it (socket writes, completion handlers, async events) is
	// collected in work and run by unlock.
	mu      sync.Mutex
	closed  bool
	qps     map[hca.QPN]*qp
	nextQPN hca.QPN
	gsi     *qp
	cqs     map[*cq]struct{}
	members []netip.Addr
	// ifi is the interface holding the bind address, where groups are
	// joined (Config.Multicast); groups the IP groups joined.
	ifi    *net.Interface
	groups map[netip.Addr]*group
	// gossip spreads the members (Config.Gossip); nil when off.
	gossip    *gossip
	memberSet map[netip.Addr]struct{}
	portFns   map[int]func(hca.AsyncEvent)
	// pkeys is the port's P_Key table (Config.PKeys, then SetPKeyTable).
	pkeys  []hca.PKey
	nextFn int
	timed  map[*qp]struct{}
	// timerWake is when timerLoop wakes next for a QP timer or a held
	// completion; zero when it waits for a kick only.
	timerWake time.Time
	// timerKicks counts kicks of timerLoop (tests).
	timerKicks atomic.Uint64
	ackQPs     []*qp
	srqs       int // live SRQs
	// heldCQs are the CQs with completions Faults.HoldCompletion holds
	// back, heldCompletions how many, holdRng the draws (hold.go).
	heldCQs         map[*cq]struct{}
	heldCompletions int
	holdRng         *rand.Rand
	// rxShifts belongs to the receive path (mu held): the ICRC ID
	// shifts of recently seen packet lengths.
	rxShifts wire.IDShiftCache
	// ipUDP is room for the IP and UDP headers an ICRC is computed over
	// (mu held): a stack array passed to wire's header writers moves to
	// the heap, one allocation per packet.
	ipUDP    [wire.IPv6HeaderLen + wire.UDPHeaderLen]byte
	work     *work
	freeWork []*work
	freeBufs [][]byte
	// workGen numbers the work batches that carry datagrams; work is
	// batch workGen until unlock hands it to a transmitter, which stores
	// the number in txDone once the socket has taken every datagram. A
	// zero-copy datagram reads a send buffer until then, so a send
	// completion that frees such a buffer waits in afterTx (in order)
	// until txDone reaches the batch that read it last.
	workGen uint64
	txDone  atomic.Uint64
	afterTx []afterTxWC

	// txMu serialises socket writes in the order work was queued under mu
	// (it is taken before mu is released), so packets of one QP leave in
	// PSN order. It also owns tx and faults.
	txMu   sync.Mutex
	tx     *sender
	faults *faultInjector

	timerKick chan struct{}
	done      chan struct{}
	wg        sync.WaitGroup
}

// txPacket is one datagram waiting for the socket: src is its QP's, the
// destination port the fabric's. With payload set it is a zero-copy
// datagram: buf[:split] (headers), payload (in the work request's
// buffer), buf[split:] (pad and ICRC); else buf is all of it.
type txPacket struct {
	buf     []byte
	payload []byte
	split   int
	to      netip.Addr
	src     *udpSocket
}

// zeroCopyMin is the smallest payload sent without copying: below it an
// iovec of its own costs more than the copy.
const zeroCopyMin = 1024

// pendingEvent is an async event to deliver outside the lock.
type pendingEvent struct {
	fn func(hca.AsyncEvent)
	ev hca.AsyncEvent
}

// work is what one critical section leaves to do after unlocking.
type work struct {
	out    []txPacket
	cqs    []*cq
	events []pendingEvent
	// closes are source sockets their last QP let go of: closed after
	// the batch's datagrams are written, outside mu, since a close waits
	// for a write in progress on the socket.
	closes []*udpSocket
}

var _ hca.Device = (*Device)(nil)

// New opens the device's socket and starts its receive and timer
// goroutines; Close stops them.
func New(cfg Config) (*Device, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	sock, err := openSocket(cfg.Bind, offloads{gso: !cfg.DisableGSO, gro: !cfg.DisableGRO}, nil)
	if err != nil {
		return nil, err // a bind address that is not local says so here
	}
	var ifi *net.Interface
	if cfg.Multicast {
		if ifi, err = BindInterface(cfg.Bind.Addr()); err == nil {
			err = sock.setMulticastSend(ifi)
		}
		if err != nil {
			sock.Close()
			return nil, err
		}
	}
	psock, err := openIPv4Receive(sock, cfg)
	if err != nil {
		sock.Close()
		return nil, err
	}
	tx := newSender(sock, txBatch)
	tx.gso = sock.gso && !cfg.Faults.active()
	d := &Device{
		cfg:       cfg,
		gid:       hca.GIDFromAddr(cfg.Bind.Addr()),
		nodeGUID:  nodeGUIDFor(cfg.Bind.Addr()),
		local:     netip.AddrPortFrom(cfg.Bind.Addr(), sock.port),
		sock:      sock,
		psock:     psock,
		tx:        tx,
		srcPorts:  newSourcePorts(sock, cfg.Bind.Addr(), ifi),
		ifi:       ifi,
		groups:    make(map[netip.Addr]*group),
		faults:    newFaultInjector(cfg.Faults),
		maxPacket: wire.PacketLen(wire.OpUDSendOnly, int(cfg.MTU)),
		qps:       make(map[hca.QPN]*qp),
		nextQPN:   randomFirstQPN(),
		cqs:       make(map[*cq]struct{}),
		memberSet: make(map[netip.Addr]struct{}),
		portFns:   make(map[int]func(hca.AsyncEvent)),
		pkeys:     cfg.PKeys,
		timed:     make(map[*qp]struct{}),
		heldCQs:   make(map[*cq]struct{}),
		holdRng:   rand.New(rand.NewPCG(cfg.Faults.Seed^holdSeedMix, cfg.Faults.Seed+1)),
		work:      &work{},
		workGen:   1,
		timerKick: make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	d.allow.Store(&cfg.Allow)
	d.addMember(d.local.Addr())
	for _, p := range cfg.Peers {
		d.addMember(p.Unmap())
	}
	var src rxSource = newUDPReceiver(sock)
	if psock != nil {
		src = newPacketReceiver(psock)
	}
	d.wg.Add(2)
	go d.rxLoop(src)
	go d.timerLoop()
	if cfg.Gossip && !cfg.Multicast {
		now := time.Now()
		d.mu.Lock()
		d.gossip = newGossip(now)
		for _, p := range cfg.Peers {
			d.askHost(p.Unmap(), now)
		}
		d.unlock()
		d.wg.Add(1)
		go d.gossipLoop()
	}
	return d, nil
}

// holdSeedMix separates the completion-hold draws from the datagram
// faults' draws of the same seed.
const holdSeedMix = 0xC0FFEE5EED

// Name implements hca.Device.
func (d *Device) Name() string { return d.cfg.Name }

// LocalAddr is the bound UDP address.
func (d *Device) LocalAddr() netip.AddrPort { return d.local }

// Port implements hca.Device. The link is always up.
func (d *Device) Port() hca.Port {
	d.mu.Lock()
	pkeys := slices.Clone(d.pkeys)
	d.mu.Unlock()
	return hca.Port{GID: d.gid, PKeys: pkeys, ActiveMTU: d.cfg.MTU, Active: true,
		PKeyViolations: d.ctr.drops[wire.DropBadPKey].Load(), UDNoBuffer: d.ctr.drops[wire.DropNoBuffer].Load()}
}

// SetPKeyTable replaces the port's P_Key table (index 0 first), as a
// subnet manager would (RoCE has none: Config.PKeys is the usual source),
// and raises EventPortPKeyChange. QPs keep their index and send with the
// value now there.
func (d *Device) SetPKeyTable(table []hca.PKey) error {
	if len(table) == 0 {
		return fmt.Errorf("rocev2: %s: empty P_Key table: %w", d.cfg.Name, hca.ErrInvalidArgument)
	}
	d.mu.Lock()
	if d.closed || slices.Equal(d.pkeys, table) {
		d.mu.Unlock()
		return nil
	}
	d.pkeys = slices.Clone(table)
	for _, id := range slices.Sorted(maps.Keys(d.portFns)) {
		d.deferEvent(d.portFns[id], hca.AsyncEvent{Type: hca.EventPortPKeyChange})
	}
	d.unlock()
	return nil
}

// pkeyAt is the P_Key at index i, or 0 (matching nothing) if out of
// range; mu held.
func (d *Device) pkeyAt(i int) hca.PKey {
	if i < 0 || i >= len(d.pkeys) {
		return 0
	}
	return d.pkeys[i]
}

// Limits implements hca.Device.
func (d *Device) Limits() hca.Limits {
	return hca.Limits{MaxQP: maxQP, MaxQPWR: maxQPWR, MaxCQE: maxCQE, MaxSRQWR: maxSRQWR, MaxMsgSize: maxMsgSize,
		LocalCAACKDelay: localCAACKDelay, NodeGUID: d.nodeGUID,
		Offloads: d.offloads()}
}

// Stats returns a snapshot of the device's counters.
func (d *Device) Stats() Stats {
	s := d.ctr.snapshot()
	if n, ok := d.socketDrops(); ok {
		d.ctr.socketDrops.Store(n)
	}
	s.SocketDrops = d.ctr.socketDrops.Load() // the last reading once closed
	return s
}

// Objects counts what a device holds at one moment: a consumer that
// released everything leaves zeros, and a quiescent one no held work.
type Objects struct {
	QPs, CQs, SRQs   int // live verbs objects; the GSI QP is among the QPs
	McastAttachments int // (QP, group) pairs
	// HeldCompletions are completions Faults.HoldCompletion has not let
	// into their CQ yet; HeldDatagrams datagrams Faults.Delay has not
	// sent yet.
	HeldCompletions, HeldDatagrams int
}

// Objects returns the device's live objects and held work.
func (d *Device) Objects() Objects {
	d.mu.Lock()
	o := Objects{QPs: len(d.qps), CQs: len(d.cqs), SRQs: d.srqs, HeldCompletions: d.heldCompletions}
	for _, q := range d.qps {
		o.McastAttachments += q.mcast.Len()
	}
	d.mu.Unlock()
	d.txMu.Lock()
	o.HeldDatagrams = len(d.faults.held)
	d.txMu.Unlock()
	return o
}

// Members returns the multicast replication set: self, peers and every
// address heard from.
func (d *Device) Members() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]netip.Addr(nil), d.members...)
}

// QPRetransmits is how many packets QP qpn has sent again (go-back-N),
// false if the device has no such QP: 'ipoib show peers' counts them per
// connection.
func (d *Device) QPRetransmits(qpn hca.QPN) (uint64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q, ok := d.qps[qpn]
	if !ok {
		return 0, false
	}
	return q.retransmits, true
}

// Allow is the allow list in force (Config.Allow, then SetAllow).
func (d *Device) Allow() []netip.Prefix { return slices.Clone(*d.allow.Load()) }

// SetAllow replaces the allow list (Config.Allow) while the device runs:
// the next datagram is judged by it. Connections to sources it no longer
// admits are not torn down here; their packets are dropped, counted
// not_allowed, and the consumer's timeouts end them.
func (d *Device) SetAllow(allow []netip.Prefix) error {
	allow, err := normalizeAllow(allow)
	if err != nil {
		return err
	}
	d.allow.Store(&allow)
	return nil
}

// AddPeer adds a as a multicast replication target, as if heard from:
// the hook for a membership service or a CLI learning hosts at run time.
func (d *Device) AddPeer(a netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addMember(a.Unmap())
}

// Alloc implements hca.Device. Any Go memory works for a UDP socket; the
// method exists so consumers keep to the verbs discipline.
func (d *Device) Alloc(size int) ([]byte, error) {
	if size < 0 {
		return nil, fmt.Errorf("rocev2: alloc %d bytes: %w", size, hca.ErrInvalidArgument)
	}
	return make([]byte, size), nil
}

// CreateCQ implements hca.Device.
func (d *Device) CreateCQ(cfg hca.CQConfig) (hca.CQ, error) {
	if cfg.Size <= 0 || cfg.Size > maxCQE {
		return nil, fmt.Errorf("rocev2: CQ size %d: %w", cfg.Size, hca.ErrInvalidArgument)
	}
	c := &cq{dev: d, cfg: cfg, ring: core.NewRing[*qp](cfg.Size)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("rocev2: create CQ: %w", hca.ErrDestroyed)
	}
	d.cqs[c] = struct{}{}
	return c, nil
}

// CreateSRQ implements hca.Device.
func (d *Device) CreateSRQ(cfg hca.SRQConfig) (hca.SRQ, error) {
	if cfg.MaxWR <= 0 || cfg.MaxWR > maxSRQWR {
		return nil, fmt.Errorf("rocev2: SRQ size %d: %w", cfg.MaxWR, hca.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("rocev2: create SRQ: %w", hca.ErrDestroyed)
	}
	d.srqs++
	return &srq{dev: d, cfg: cfg, ring: core.NewQueue[hca.RecvWR](cfg.MaxWR)}, nil
}

// CreateAH implements hca.Device. A unicast DGID must be an address of the
// device's family: it is where the datagrams go.
func (d *Device) CreateAH(dgid hca.GID) (hca.AH, error) {
	if !dgid.IsMulticast() && dgid.Addr().Is4() != d.local.Addr().Is4() {
		return nil, fmt.Errorf("rocev2: AH to %v from %v: %w", dgid, d.local.Addr(), hca.ErrInvalidArgument)
	}
	a := &ah{dgid: dgid}
	if d.cfg.Multicast {
		a.group, _ = GroupAddr(dgid, d.local.Addr().Is4())
	}
	return a, nil
}

// OnPortEvent implements hca.Device. The UDP port never goes down, so the
// only event is PKEY_CHANGE (SetPKeyTable).
func (d *Device) OnPortEvent(fn func(hca.AsyncEvent)) (cancel func()) {
	d.mu.Lock()
	id := d.nextFn
	d.nextFn++
	d.portFns[id] = fn
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		delete(d.portFns, id)
		d.mu.Unlock()
	}
}

// Close implements hca.Device: it stops the goroutines, closes the socket
// and releases every object; nothing is delivered afterwards.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("rocev2: close %s: %w", d.cfg.Name, hca.ErrDestroyed)
	}
	d.closed = true
	for _, q := range d.qps {
		q.destroyed.Store(true)
		q.disarmTimer()
	}
	clear(d.qps)
	d.gsi = nil
	for c := range d.heldCQs {
		c.dropHeld()
	}
	srcs := d.srcPorts.takeAll(&d.ctr)
	gerr := d.closeGroups()
	d.mu.Unlock()
	for _, s := range srcs {
		_ = s.Close()
	}
	close(d.done)
	if n, ok := d.socketDrops(); ok {
		d.ctr.socketDrops.Store(n)
	}
	err := d.sock.Close()
	if d.psock != nil {
		err = errors.Join(err, d.psock.Close())
	}
	d.wg.Wait()
	if err != nil {
		return errors.Join(fmt.Errorf("rocev2: close socket: %w", err), gerr)
	}
	return gerr
}

// addMember adds a multicast replication target; called with mu held or
// before the device is shared.
func (d *Device) addMember(a netip.Addr) {
	if _, ok := d.memberSet[a]; ok || !a.IsValid() || a.Is4() != d.local.Addr().Is4() {
		return
	}
	if len(d.members) >= d.cfg.MaxMembers {
		d.ctr.memberRefused.Add(1)
		return
	}
	d.memberSet[a] = struct{}{}
	d.members = append(d.members, a)
}

// deferCompletion schedules a CQ's completion handler; mu held.
func (d *Device) deferCompletion(c *cq) { d.work.cqs = append(d.work.cqs, c) }

// deferClose schedules the close of a source socket (nil: none); mu
// held.
func (d *Device) deferClose(s *udpSocket) {
	if s != nil {
		d.work.closes = append(d.work.closes, s)
	}
}

// deferEvent schedules an async event; mu held.
func (d *Device) deferEvent(fn func(hca.AsyncEvent), ev hca.AsyncEvent) {
	d.work.events = append(d.work.events, pendingEvent{fn, ev})
}

// getBuf returns a packet buffer of maxPacket bytes; mu held.
func (d *Device) getBuf() []byte {
	if n := len(d.freeBufs); n > 0 {
		b := d.freeBufs[n-1]
		d.freeBufs = d.freeBufs[:n-1]
		return b[:cap(b)]
	}
	return make([]byte, d.maxPacket)
}

// queuePacket fills in the ICRC of pkt (a buffer from getBuf, sliced to
// the packet) as the kernel will send it from src to dst, and queues it;
// mu held. The ICRC covers the UDP ports, so the socket is fixed here.
func (d *Device) queuePacket(src *udpSocket, dst netip.Addr, pkt []byte) {
	if src == nil {
		src = d.sock
	}
	hdr := &d.ipUDP
	udpLen := wire.UDPHeaderLen + len(pkt)
	n := wire.PutIPHeader(hdr[:], d.local.Addr(), dst, udpLen)
	wire.PutUDPHeader(hdr[n:], src.port, d.local.Port(), udpLen)
	_ = wire.PutICRC(hdr[:n], hdr[n:n+wire.UDPHeaderLen], pkt)
	if d.cfg.Tap != nil {
		d.cfg.Tap.Datagram(netip.AddrPortFrom(d.local.Addr(), src.port), netip.AddrPortFrom(dst, d.local.Port()), pkt)
	}
	d.work.out = append(d.work.out, txPacket{buf: pkt, to: dst, src: src})
}

// queueZeroCopy queues a datagram whose payload stays in the caller's
// send buffer: buf (from getBuf) holds the h header bytes, then room for
// the pad and the ICRC. It returns the batch number the caller's
// completion must wait for (completeSendAfter). With a tap the datagram
// is copied whole (the tap sees packets in one piece). mu held.
func (d *Device) queueZeroCopy(src *udpSocket, dst netip.Addr, buf []byte, h int, payload []byte) uint64 {
	pad := int(wire.PadCount(len(payload)))
	tail := buf[h : h+pad+wire.ICRCLen]
	clear(tail[:pad])
	if d.tapping() {
		n := copy(buf[h:], payload)
		clear(buf[h+n : h+n+pad])
		d.queuePacket(src, dst, buf[:h+n+pad+wire.ICRCLen])
		return 0
	}
	if src == nil {
		src = d.sock
	}
	hdr := &d.ipUDP
	udpLen := wire.UDPHeaderLen + h + len(payload) + len(tail)
	n := wire.PutIPHeader(hdr[:], d.local.Addr(), dst, udpLen)
	wire.PutUDPHeader(hdr[n:], src.port, d.local.Port(), udpLen)
	_ = wire.PutICRCSplit(hdr[:n], hdr[n:n+wire.UDPHeaderLen], buf[:h], payload, tail)
	d.work.out = append(d.work.out, txPacket{buf: buf[:h+len(tail)], payload: payload, split: h, to: dst, src: src})
	d.ctr.txZeroCopy.Add(1)
	return d.workGen
}

// tapping reports whether a tap looks at the packets.
func (d *Device) tapping() bool {
	if d.cfg.Tap == nil {
		return false
	}
	t, ok := d.cfg.Tap.(IdleTap)
	return !ok || !t.Idle()
}

// afterTxWC is a send completion waiting for a transmit (afterTx).
type afterTxWC struct {
	q   *qp
	wc  hca.WC
	gen uint64
}

// releaseAfterTx delivers the waiting send completions whose transmits
// are done, in order; it reports whether it delivered any. mu held.
func (d *Device) releaseAfterTx() bool {
	done := d.txDone.Load()
	i := 0
	for ; i < len(d.afterTx) && d.afterTx[i].gen <= done; i++ {
		e := &d.afterTx[i]
		e.q.sendCQ.push(e.q, &e.wc)
		*e = afterTxWC{}
	}
	if i == 0 {
		return false
	}
	rest := copy(d.afterTx, d.afterTx[i:])
	clear(d.afterTx[rest:])
	d.afterTx = d.afterTx[:rest]
	return true
}

// awaitTx returns once no transmit reads what batch gen referenced, for a
// QP about to give its send buffers back without completions (reset,
// destroy). gen was read under mu and mu released since, so every batch
// up to gen has been handed to a transmitter, which took txMu before it
// let go of mu (unlock) and holds it until txDone reaches its number:
// taking txMu waits out the transmit in progress. mu must not be held,
// or the device would stall on a socket write.
func (d *Device) awaitTx(gen uint64) {
	for gen > d.txDone.Load() {
		d.txMu.Lock()
		d.txMu.Unlock()
	}
}

// dropAfterTx forgets the send completions of q still waiting for a
// transmit: q is being destroyed, and nothing of it may reach a CQ once
// Destroy returns. mu held.
func (d *Device) dropAfterTx(q *qp) {
	kept := d.afterTx[:0]
	for _, e := range d.afterTx {
		if e.q != q {
			kept = append(kept, e)
		}
	}
	clear(d.afterTx[len(kept):])
	d.afterTx = kept
}

// unlock releases mu and then does the work the critical section queued:
// socket writes first (in queue order, under txMu), then completion
// handlers and async events, outside every lock.
func (d *Device) unlock() {
	w := d.work
	if len(w.out) == 0 && len(w.cqs) == 0 && len(w.events) == 0 && len(w.closes) == 0 {
		d.mu.Unlock()
		return
	}
	if n := len(d.freeWork); n > 0 {
		d.work = d.freeWork[n-1]
		d.freeWork = d.freeWork[:n-1]
	} else {
		d.work = &work{}
	}
	if len(w.out) > 0 {
		gen := d.workGen
		d.workGen++
		d.txMu.Lock()
		d.mu.Unlock()
		d.transmit(w.out)
		d.txDone.Store(gen)
		d.txMu.Unlock()
	} else {
		d.mu.Unlock()
	}
	for _, s := range w.closes {
		_ = s.Close()
	}
	for _, c := range w.cqs {
		c.cfg.OnCompletion()
	}
	for _, e := range w.events {
		e.fn(e.ev)
	}
	d.mu.Lock()
	for i := range w.out {
		d.freeBufs = append(d.freeBufs, w.out[i].buf)
		w.out[i] = txPacket{}
	}
	w.out = w.out[:0]
	clear(w.cqs)
	w.cqs = w.cqs[:0]
	clear(w.events)
	w.events = w.events[:0]
	clear(w.closes)
	w.closes = w.closes[:0]
	d.freeWork = append(d.freeWork, w)
	if d.releaseAfterTx() {
		d.unlock() // the completion handlers of what was released
		return
	}
	d.mu.Unlock()
}

// txBatch is how many datagrams one sendmmsg may carry: a 64 KiB IPoIB
// packet at MTU 4096 is 16.
const txBatch = 64

// transmit writes packets with sendmmsg, applying faults; txMu held.
func (d *Device) transmit(out []txPacket) {
	if !d.cfg.Faults.active() {
		for i := range out {
			d.stage(&out[i])
		}
		d.flushTx()
		return
	}
	fi := d.faults
	now := time.Now()
	held := len(fi.held)
	for i := range out {
		if i+1 < len(out) && fi.reorder() && fi.mayDisturb(out[i].buf) && fi.mayDisturb(out[i+1].buf) {
			out[i], out[i+1] = out[i+1], out[i]
			d.ctr.faultReordered.Add(1)
		}
		act := fi.decide()
		if act != faultDrop && !fi.mayDisturb(out[i].buf) {
			act = faultNone
		}
		switch act {
		case faultDrop:
			d.ctr.faultDropped.Add(1)
			if isUD(out[i].buf) {
				d.ctr.udDropped.Add(1)
			}
			continue
		case faultDelay:
			fi.hold(&out[i], now)
			d.ctr.faultDelayed.Add(1)
			continue
		case faultDuplicate:
			d.stage(&out[i])
			d.ctr.faultDuplicated.Add(1)
		}
		d.stage(&out[i])
	}
	d.flushTx()
	d.releaseHeld(now)
	if held == 0 && len(fi.held) > 0 {
		// The timer loop does not know about the new deadline yet.
		d.kickTimers()
	}
}

// stage adds a datagram to the write batch, flushing a full batch; txMu
// held.
func (d *Device) stage(p *txPacket) {
	if !d.tx.stagePacket(p) {
		d.flushTx()
		d.tx.stagePacket(p)
	}
}

// flushTx writes the staged batch and warns, rate-limited, of the
// datagrams the kernel refused; txMu held.
func (d *Device) flushTx() {
	f := d.tx.flush(&d.ctr)
	if f.tooBig > 0 {
		d.warnTooBig.warn(d.cfg.Logger, time.Now(), f.tooBig, "rocev2: datagram larger than the route to the peer carries (EMSGSIZE), dropped: lower --ib-mtu or raise the underlay MTU",
			"dev", d.cfg.Name, "ib_mtu", int(d.cfg.MTU), "err", f.tooBigErr)
	}
	if f.other > 0 && !errors.Is(f.otherErr, net.ErrClosed) {
		d.warnTx.warn(d.cfg.Logger, time.Now(), f.other, "rocev2: transmit failed", "dev", d.cfg.Name, "err", f.otherErr)
	}
}

// releaseHeld writes the delayed datagrams that are due; txMu held.
func (d *Device) releaseHeld(now time.Time) {
	fi := d.faults
	for {
		n := fi.release(now, d.tx)
		if n == 0 {
			return
		}
		d.flushTx()
		fi.recycle(n)
	}
}

// releaseHeldAt takes txMu, writes the due delayed datagrams and returns
// the next release time, zero if none.
func (d *Device) releaseHeldAt(now time.Time) time.Time {
	d.txMu.Lock()
	defer d.txMu.Unlock()
	d.releaseHeld(now)
	return d.faults.nextDue()
}

// timerLoop fires the RC retransmit and RNR timers of every QP. One
// goroutine per device scans the armed QPs when the earliest deadline
// passes or when a QP arms a timer.
func (d *Device) timerLoop() {
	defer d.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-d.timerKick:
		case <-t.C:
		}
		d.mu.Lock()
		now := time.Now()
		var next time.Time
		for q := range d.timed {
			if !q.deadline.After(now) {
				q.fireTimer()
				continue
			}
			if next.IsZero() || q.deadline.Before(next) {
				next = q.deadline
			}
		}
		// fireTimer may have re-armed; look once more for the earliest.
		for q := range d.timed {
			if next.IsZero() || q.deadline.Before(next) {
				next = q.deadline
			}
		}
		if due := d.releaseCompletions(now); !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
		d.timerWake = next
		d.unlock()
		if due := d.releaseHeldAt(now); !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
		if next.IsZero() {
			t.Reset(time.Hour)
		} else {
			t.Reset(max(time.Until(next), 0))
		}
	}
}

// kickTimers makes timerLoop rescan; mu held.
func (d *Device) kickTimers() {
	d.timerKicks.Add(1)
	select {
	case d.timerKick <- struct{}{}:
	default:
	}
}

// allowed reports whether datagrams from a may be parsed: a is the
// device itself or inside Config.Allow (empty: everyone).
func (d *Device) allowed(a netip.Addr) bool {
	allow := *d.allow.Load()
	if len(allow) == 0 || a == d.local.Addr() {
		return true
	}
	for _, p := range allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
