package ipoibcm

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/mutation"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// The tests in this file force one teardown race each (docs/linux.md
// §10 rows 1, 3, 4 and 8) by holding completions in the
// soft fabric, by holding and interleaving the engine at its verbs calls
// (wrapDevice) and by the host port's own record of what the reader has handled. Nothing waits for a
// moment to pass: every step waits for the event that makes the next one
// safe. Row 2 (many connections reaped at once: one drain outstanding, the
// CQ never overflows) is TestManyConnectionsReapedAtOnce's.

const (
	raceWait     = 20 * time.Second // how long a step may take before the test fails
	raceFrameLen = 200              // IP bytes of every frame the tests send
)

var (
	raceSrcIP = [4]byte{10, 0, 0, 1}
	raceDstIP = [4]byte{10, 0, 0, 2}
)

// racePort is a HostPort the test feeds in batches and that tells the test
// how far the host reader got. The reader handles a batch entirely (under
// Interface.mu, posting or parking every frame) before it reads again, so
// "the reader is back in ReadFrames" means "every earlier batch is
// handled", and "ReadFrames returned batch n" means "the reader is about to
// take Interface.mu for it".
type racePort struct {
	mac    net.HardwareAddr
	in     chan [][]byte
	closed chan struct{}
	once   sync.Once

	mu      sync.Mutex
	rest    [][]byte // frames of a batch larger than the reader's buffers
	pushed  int      // batches pushed
	taken   int      // batches ReadFrames returned in full
	handled int      // batches handled: the reader came back for more
	changed chan struct{}
}

func newRacePort(mac byte) *racePort {
	return &racePort{
		mac:     net.HardwareAddr{0x02, 0, 0, 0, 0xee, mac},
		in:      make(chan [][]byte, 64),
		closed:  make(chan struct{}),
		changed: make(chan struct{}),
	}
}

// push queues one batch for the reader and returns its number.
func (p *racePort) push(frames ...[]byte) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pushed++
	p.in <- frames // buffered far beyond what a test pushes: never blocks
	return p.pushed
}

// notifyLocked wakes every waiter; under p.mu.
func (p *racePort) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// wait waits until cond (called under p.mu) holds; false after d.
func (p *racePort) wait(d time.Duration, cond func() bool) bool {
	timeout := time.After(d)
	for {
		p.mu.Lock()
		ok, changed := cond(), p.changed
		p.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-timeout:
			return false
		}
	}
}

// waitHandled waits until the reader handled batch n.
func (p *racePort) waitHandled(t *testing.T, n int) {
	t.Helper()
	if !p.wait(raceWait, func() bool { return p.handled >= n }) {
		t.Fatalf("host reader did not handle batch %d", n)
	}
}

// waitTaken waits until the reader read batch n; usable off the test
// goroutine.
func (p *racePort) waitTaken(n int) bool {
	return p.wait(raceWait, func() bool { return p.taken >= n })
}

func (p *racePort) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	p.mu.Lock()
	batch := p.rest
	if len(batch) == 0 && p.handled != p.taken {
		p.handled = p.taken
		p.notifyLocked()
	}
	p.mu.Unlock()
	if len(batch) == 0 {
		select {
		case batch = <-p.in:
		case <-p.closed:
			return 0, fmt.Errorf("race port: %w", net.ErrClosed)
		}
	}
	n := min(len(bufs), len(batch))
	for k := range n {
		sizes[k] = copy(bufs[k], batch[k])
	}
	p.mu.Lock()
	p.rest = batch[n:]
	if len(p.rest) == 0 {
		p.taken++
		p.notifyLocked()
	}
	p.mu.Unlock()
	return n, nil
}

func (p *racePort) WriteFrames(frames [][]byte) (int, error) { return len(frames), nil }
func (p *racePort) BatchSize() int                           { return 64 }
func (p *racePort) HostMAC() net.HardwareAddr                { return p.mac }
func (p *racePort) SetMTU(int) error                         { return nil }
func (p *racePort) SetLinkUp(bool) error                     { return nil }
func (p *racePort) Close() error                             { p.once.Do(func() { close(p.closed) }); return nil }

// raceFrame is an Ethernet/IPv4 frame whose IP identification field
// carries seq and whose payload is a pattern derived from seq.
func raceFrame(dst, src frame.MAC, seq int) []byte {
	f := rvIPv4(dst, src, raceSrcIP, raceDstIP, raceFrameLen)
	ip := f[frame.EthHdrLen:]
	binary.BigEndian.PutUint16(ip[4:6], uint16(seq))
	for k := 20; k < raceFrameLen; k++ {
		ip[k] = byte(seq*31 + k)
	}
	return f
}

// raceSeq reads raceFrame's sequence number from an IP packet and reports
// whether the packet arrived intact.
func raceSeq(ip []byte) (int, bool) {
	if len(ip) < 20 || ip[0]>>4 != 4 {
		return 0, false
	}
	seq := int(binary.BigEndian.Uint16(ip[4:6]))
	if len(ip) != raceFrameLen {
		return seq, false
	}
	for k := 20; k < raceFrameLen; k++ {
		if ip[k] != byte(seq*31+k) {
			return seq, false
		}
	}
	return seq, true
}

// rxRecord is one packet a receiver's rxPacket hook saw.
type rxRecord struct {
	seq    int
	intact bool
}

// raceRecv is what a receiving Interface is seen to do from outside: the
// packets its host port gets, the completions of dead connections its RX
// poller polls (at the device) and its reaps (EventReaped).
type raceRecv struct {
	packets chan rxRecord // IPv4 frames written to the host port
	dead    chan hca.WC   // completions of connections marked dead, as polled
	reaped  chan Event    // EventReaped
}

func newRaceRecv() *raceRecv {
	return &raceRecv{packets: make(chan rxRecord, 64), dead: make(chan hca.WC, 64), reaped: make(chan Event, 64)}
}

// observe has r see what the receiver behind port and dev does; c is its
// Config (the reaps are its events).
func (r *raceRecv) observe(c *Config, port *rvCapture, dev *wrapDevice) {
	port.onWrite = func(f []byte) {
		if rvIsIPv4(f) {
			seq, ok := raceSeq(f[frame.EthHdrLen:])
			r.packets <- rxRecord{seq, ok}
		}
	}
	// The dead flag is set under the RX poll lock and a Poll runs under
	// it, so a completion whose connection is dead when polled is one the
	// RX path recycles as dead (rx_dead_dropped).
	dev.polled = func(_ *wrapCQ, wcs []hca.WC) {
		for _, wc := range wcs {
			if rc, ok := wc.Context.(*rxConn); ok && wc.ID != wrDrain && rc.dead.Load() {
				r.dead <- wc
			}
		}
	}
	c.Events = Observers(c.Events, eventsTo{EventReaped, r.reaped})
}

// reapedQPN waits for the next reap r sees and returns its QPN.
func (r *raceRecv) reapedQPN(t *testing.T) hca.QPN {
	t.Helper()
	return recvOne(t, r.reaped, "reap").QPN
}

// raceFabric is a soft fabric closed at cleanup, after every Interface
// started on it; no goroutine may outlive them.
func raceFabric(t *testing.T, cfg soft.Config) *soft.Fabric {
	t.Helper()
	base := runtime.NumGoroutine()
	fab := soft.NewFabric(cfg)
	t.Cleanup(func() {
		fab.Close()
		checkGoroutines(t, base)
	})
	return fab
}

// raceStart creates an Interface on a new wrapped device of fab (tweak
// sets up the device's callbacks and the Config before New) and closes it
// at cleanup.
func raceStart(t *testing.T, fab *soft.Fabric, name string, host HostPort, tweak func(*Config, *wrapDevice)) *Interface {
	t.Helper()
	dev := newWrapDevice(t, fab, name)
	ifc := testInterface(t, dev, host, name, func(c *Config) {
		if tweak != nil {
			tweak(c, dev)
		}
	})
	startTest(t, ifc)
	return ifc
}

// onlyTXConn is ifc's single active connection.
func onlyTXConn(t *testing.T, ifc *Interface) *txConn {
	t.Helper()
	conns := ifc.active.snapshot()
	if len(conns) != 1 {
		t.Fatalf("%s has %d active connections, want 1", ifc.Name(), len(conns))
	}
	return conns[0]
}

// onlyRXConn is ifc's single passive connection, read under the passive
// set's lock.
func onlyRXConn(t *testing.T, ifc *Interface) *rxConn {
	t.Helper()
	p := &ifc.passive
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.set) != 1 {
		t.Fatalf("%s has %d passive connections, want 1", ifc.Name(), len(p.set))
	}
	for rc := range p.set {
		return rc
	}
	panic("unreachable")
}

func recvOne[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(raceWait):
		t.Fatalf("no %s within %v", what, raceWait)
		panic("unreachable")
	}
}

// noMore fails if ch holds another value.
func noMore[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %+v", what, v)
	default:
	}
}

// seqsWritten drains the frames a capture port got and returns their
// sequence numbers.
func seqsWritten(c *rvCapture) []int {
	var seqs []int
	for {
		select {
		case f := <-c.frames:
			if rvIsIPv4(f) {
				seq, _ := raceSeq(f[frame.EthHdrLen:])
				seqs = append(seqs, seq)
			}
		default:
			return seqs
		}
	}
}

// afterDestroyRun is what one run of the completion-after-destroy race
// observed.
type afterDestroyRun struct {
	rc *rxConn
	// Before the held completions were released.
	pendingHeld  int
	reapedBefore uint64
	drainsBefore uint64
	// After.
	delivered []rxRecord // frames the host port got, in order
	deadWCs   []hca.WC
	written   []int // sequence numbers the host port got
	st        Stats
	fs        soft.FabricStats
}

// runCompletionAfterDestroy: frame 1 sets the connection up; frame 2's
// receive completion is held in b's RX CQ; the connection is torn down
// (QP to Error, LAST_WQE, drain WR, all while the completion is held); the
// hold is released and the RX poller finds the data completion, then the
// drain's flush completion behind it.
func runCompletionAfterDestroy(t *testing.T, mut mutation.Soak) afterDestroyRun {
	fab := raceFabric(t, soft.Config{Seed: 31})
	pa, pb := newRacePort(1), rvNewCapture(2)
	recv := newRaceRecv()
	a := raceStart(t, fab, "a", pa, nil)
	b := raceStart(t, fab, "b", pb, func(c *Config, d *wrapDevice) {
		recv.observe(c, pb, d)
		d.mut = mut
	})
	mac := rvLearn(a, b.HWAddr(), netip.AddrFrom4(raceDstIP), time.Now())
	src := frame.MAC(pa.mac)

	pa.push(raceFrame(mac, src, 1))
	if got := recvOne(t, recv.packets, "frame 1 at b"); got.seq != 1 || !got.intact {
		t.Fatalf("b got %+v first, want frame 1 intact", got)
	}
	var run afterDestroyRun
	run.rc = onlyRXConn(t, b)
	hold, err := fab.HoldCompletions(softCQ(b.rxCQ))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	// The soft fabric delivers an RC send inside PostSend: once the reader
	// handled frame 2 it sits in an SRQ buffer of b, its completion held.
	pa.waitHandled(t, pa.push(raceFrame(mac, src, 2)))
	if p := fab.Stats().PendingCompletion; p != 1 {
		t.Fatalf("%d completions held after frame 2, want its receive alone", p)
	}

	barrier := newEventBarrier(t, b.dev)
	if n := recvOne(t, killPassive(&testNode{ifc: b}), "teardown"); n != 1 {
		t.Fatalf("teardown moved %d connections, want 1", n)
	}
	// The connection's LAST_WQE was raised by the teardown's move to
	// Error, before the barrier's: once the barrier passed, its handler
	// posted onLastWQE; once an item behind that ran, the drain is posted
	// (its flush completion held behind frame 2's).
	if passed, err := barrier.pass(raceWait); err != nil || !passed {
		t.Fatalf("LAST_WQE not delivered: passed %v, %v", passed, err)
	}
	onControl(t, &testNode{ifc: b}, func() {})
	run.pendingHeld = fab.Stats().PendingCompletion
	run.reapedBefore = b.passive.reaper.ctr.reaped.Load()
	run.drainsBefore = b.passive.reaper.ctr.drainsPosted.Load()

	hold.Release()
	select {
	case r := <-recv.packets:
		run.delivered = append(run.delivered, r)
	case wc := <-recv.dead:
		run.deadWCs = append(run.deadWCs, wc)
	case <-time.After(raceWait):
		t.Fatal("frame 2's completion was neither delivered nor dropped dead")
	}
	if got := recv.reapedQPN(t); got != run.rc.qp.QPN() {
		t.Fatalf("reaped QP %#x, want the torn-down connection's %#x", got, run.rc.qp.QPN())
	}
	// The poll that found the drain completion may still be handing its
	// batch to the host and reposting buffers: wait for it under the poll
	// lock.
	b.rxNAPI.Sync(func() {})
	for len(recv.packets) > 0 {
		run.delivered = append(run.delivered, <-recv.packets)
	}
	for len(recv.dead) > 0 {
		run.deadWCs = append(run.deadWCs, <-recv.dead)
	}
	run.written = seqsWritten(pb)
	run.st = b.Stats()
	run.fs = fab.Stats()
	return run
}

// TestRaceCompletionAfterDestroy (docs/linux.md §10 row 1): a receive
// completion of a passive connection is still queued when the connection
// is torn down. It must be recycled to the SRQ and counted
// rx_dead_dropped, never delivered, and the QP must be destroyed only once
// the drain completion behind it was polled. With the dead flag or the
// drain switched off the same interleaving shows the violation.
func TestRaceCompletionAfterDestroy(t *testing.T) {
	t.Run("safe", func(t *testing.T) {
		run := runCompletionAfterDestroy(t, mutation.Soak{})
		// Held at release: frame 2's receive and the drain's flush; the QP
		// still alive although teardown, LAST_WQE and the drain post are
		// all done.
		if run.pendingHeld != 2 || run.reapedBefore != 0 || run.drainsBefore != 1 {
			t.Fatalf("before release: %d completions held, %d reaped, %d drains posted; want 2, 0, 1",
				run.pendingHeld, run.reapedBefore, run.drainsBefore)
		}
		if len(run.delivered) != 0 {
			t.Fatalf("delivered to the host after teardown: %+v", run.delivered)
		}
		if len(run.deadWCs) != 1 {
			t.Fatalf("%d dead completions, want frame 2's", len(run.deadWCs))
		}
		wc := run.deadWCs[0]
		if wc.Context != any(run.rc) || wrKind(wc.ID) != wrKindSRQRecv || wc.QPN != run.rc.qp.QPN() || wc.Status != hca.StatusSuccess {
			t.Fatalf("dead completion %+v, want frame 2's SRQ receive on QP %#x", wc, run.rc.qp.QPN())
		}
		for _, seq := range run.written {
			if seq == 2 {
				t.Fatalf("host port got frame 2 (frames written: %v)", run.written)
			}
		}
		st, r := run.st, run.st.Reaper
		if st.Counters.RxDeadDropped != 1 {
			t.Fatalf("rx_dead_dropped %d, want 1", st.Counters.RxDeadDropped)
		}
		if st.SRQPosted != DefaultRecvQueueSize {
			t.Fatalf("SRQ posted %d, want %d: the dead buffer was not recycled", st.SRQPosted, DefaultRecvQueueSize)
		}
		if r.MovedToError != 1 || r.LastWQESeen != 1 || r.DrainsPosted != 1 || r.DrainsCompleted != 1 || r.Reaped != 1 {
			t.Fatalf("reaper %+v", r)
		}
		if fs := run.fs; fs.CompletionsAfterDestroy != 0 || fs.DestroyedQPOps != 0 || fs.CQOverflows != 0 || fs.PendingCompletion != 0 {
			t.Fatalf("fabric: %d completions after destroy, %d destroyed-QP ops, %d overflows, %d still held",
				fs.CompletionsAfterDestroy, fs.DestroyedQPOps, fs.CQOverflows, fs.PendingCompletion)
		}
		if len(st.RXConns) != 0 {
			t.Fatalf("passive connections left: %+v", st.RXConns)
		}
	})
	t.Run("SkipDeadFlag mutation delivers it", func(t *testing.T) {
		run := runCompletionAfterDestroy(t, mutation.Soak{SkipDeadFlag: true})
		if len(run.delivered) != 1 || run.delivered[0].seq != 2 || run.st.Counters.RxDeadDropped != 0 {
			t.Fatalf("without the dead flag frame 2 must reach the host of a dead connection: delivered %+v, rx_dead_dropped %d",
				run.delivered, run.st.Counters.RxDeadDropped)
		}
	})
	t.Run("SkipDrain mutation polls it after destroy", func(t *testing.T) {
		run := runCompletionAfterDestroy(t, mutation.Soak{SkipDrain: true})
		if run.reapedBefore != 1 || run.drainsBefore != 0 {
			t.Fatalf("without the drain the QP goes at once: %d reaped, %d drains before release", run.reapedBefore, run.drainsBefore)
		}
		if run.fs.CompletionsAfterDestroy != 1 {
			t.Fatalf("without the drain frame 2's completion is polled after its QP was destroyed: %d completions after destroy, want 1",
				run.fs.CompletionsAfterDestroy)
		}
	})
}

// TestRaceLastWQEBeforeLive (docs/linux.md §10 row 3): the passive QP
// errors while the REQ handler still runs, before the connection joins the
// engine's connection set, and its LAST_WQE is handled there and then. The
// connection is reaped exactly once, nothing is left behind, and the peer
// gets a new connection.
//
//   - "handled": LAST_WQE's handling ran (the drain is posted, its
//     completion held) before the connection joined the set; the reap
//     comes after.
//   - "reaped": the whole teardown, drain and destroy included, finished
//     before the connection joined the set.
func TestRaceLastWQEBeforeLive(t *testing.T) {
	for _, reapFirst := range []bool{false, true} {
		name := "handled"
		if reapFirst {
			name = "reaped"
		}
		t.Run(name, func(t *testing.T) { testLastWQEBeforeLive(t, reapFirst) })
	}
}

func testLastWQEBeforeLive(t *testing.T, reapFirst bool) {
	fab := raceFabric(t, soft.Config{Seed: 32})
	pa, pb := newRacePort(1), rvNewCapture(2)
	recv := newRaceRecv()
	txGone := make(chan Event, 8)
	// A REJ normally backs CM off for CMBackoff; a nanosecond lets the
	// next frame retry at once.
	a := raceStart(t, fab, "a", pa, func(c *Config, _ *wrapDevice) {
		c.CMBackoff = time.Nanosecond
		c.Events = eventsTo{EventTXDestroyed, txGone}
	})

	type hookResult struct {
		rc       *rxConn
		err      error
		state    rxState // when the hook returned
		inSet    bool    // on rxConns when the hook returned
		accepted uint64  // rxAccepted when the hook returned
	}
	hooked := make(chan hookResult, 1)
	var calls atomic.Int32
	var b *Interface
	var barrier *eventBarrier
	var hold *soft.CompletionHold
	b = raceStart(t, fab, "b", pb, func(c *Config, d *wrapDevice) {
		recv.observe(c, pb, d)
		// On the CM goroutine in acceptREQ, the new passive QP just moved
		// to Init, before the connection joins rxConns: the QP is errored
		// there (kernel race 3, LAST_WQE before the connection is live).
		d.qpModified = func(ctx any, attr hca.QPAttr) {
			rc, ok := ctx.(*rxConn)
			if !ok || attr.State != hca.QPStateInit {
				return
			}
			if calls.Add(1) != 1 {
				return // the reconnection is accepted normally
			}
			i := b
			res := hookResult{rc: rc}
			defer func() {
				i.passive.mu.Lock()
				res.state = rc.state
				_, res.inSet = i.passive.set[rc]
				i.passive.mu.Unlock()
				res.accepted = i.passive.limits.ctr.accepted.Load()
				hooked <- res
			}()
			if err := rc.qp.Modify(hca.QPAttr{State: hca.QPStateError}); err != nil {
				res.err = fmt.Errorf("QP to Error in the REQ handler: %w", err)
				return
			}
			if reapFirst {
				select {
				case got := <-recv.reaped:
					if got.QPN != rc.qp.QPN() {
						res.err = fmt.Errorf("reaped QP %#x, want %#x", got.QPN, rc.qp.QPN())
					}
				case <-time.After(raceWait):
					res.err = fmt.Errorf("not reaped inside the REQ handler")
				}
				return
			}
			// The barrier's LAST_WQE is dispatched after this QP's: once
			// it passed, onLastWQE is queued; once an item behind it ran,
			// it ran too. The drain it posted stays held.
			if passed, err := barrier.pass(raceWait); err != nil || !passed {
				res.err = fmt.Errorf("LAST_WQE not delivered: passed %v, %v", passed, err)
				return
			}
			done := make(chan struct{})
			i.ctl.post(func() { close(done) })
			select {
			case <-done:
			case <-time.After(raceWait):
				res.err = fmt.Errorf("control loop did not run onLastWQE")
			}
		}
	})
	barrier = newEventBarrier(t, b.dev)
	if !reapFirst {
		var err error
		if hold, err = fab.HoldCompletions(softCQ(b.rxCQ)); err != nil {
			t.Fatal(err)
		}
		defer hold.Release()
	}
	mac := rvLearn(a, b.HWAddr(), netip.AddrFrom4(raceDstIP), time.Now())
	src := frame.MAC(pa.mac)

	pa.push(raceFrame(mac, src, 1))
	res := recvOne(t, hooked, "REQ handler")
	if res.err != nil {
		t.Fatal(res.err)
	}
	rc := res.rc
	if res.inSet || res.accepted != 0 {
		t.Fatalf("hook ran with the connection already in the set (%v) or accepted (%d)", res.inSet, res.accepted)
	}
	wantState := rxDrain
	if reapFirst {
		wantState = rxDestroyed
	}
	if res.state != wantState {
		t.Fatalf("connection %s when the REQ handler went on, want %s", res.state, wantState)
	}
	// The peer's connection fails (REJ): its parked frame 1 is dropped.
	recvOne(t, txGone, "the peer's failed connection")
	if !reapFirst {
		hold.Release()
	}
	if !reapFirst {
		if got := recv.reapedQPN(t); got != rc.qp.QPN() {
			t.Fatalf("reaped QP %#x, want %#x", got, rc.qp.QPN())
		}
	}
	if !rc.dead.Load() {
		t.Fatal("connection reaped without the dead flag")
	}

	// The peer reconnects; frame 2 arrives over the new connection.
	pa.push(raceFrame(mac, src, 2))
	if got := recvOne(t, recv.packets, "frame 2 over the new connection"); got.seq != 2 || !got.intact {
		t.Fatalf("b got %+v, want frame 2 intact", got)
	}
	// Every step of a reap runs on b's control loop: a no-op behind them
	// orders their effects before the checks.
	onControl(t, &testNode{ifc: b}, func() {})
	noMore(t, recv.reaped, "second reap")
	st := b.Stats()
	r := st.Reaper
	if r.Reaped != 1 || r.LateLastWQE != 1 || r.LastWQESeen != 1 || r.DrainsPosted != 1 || r.DrainsCompleted != 1 {
		t.Fatalf("reaper %+v: want one late LAST_WQE, one drain, one reap", r)
	}
	if len(st.RXConns) != 1 || st.RXConns[0].State != rxLive.String() {
		t.Fatalf("passive connections %+v: want the new live one alone (the errored one leaked?)", st.RXConns)
	}
	b.mu.Lock()
	_, leaked := b.passive.set[rc]
	b.mu.Unlock()
	if leaked {
		t.Fatal("the reaped connection is still in the connection set")
	}
	// A connection reaped inside the REQ handler is refused, never
	// counted accepted; one merely errored there is accepted and its REP
	// fails.
	wantAccepted := uint64(2)
	if reapFirst {
		wantAccepted = 1
	}
	if r.RXAccepted != wantAccepted {
		t.Fatalf("%d passive connections accepted, want %d", r.RXAccepted, wantAccepted)
	}
	b.rxNAPI.Sync(func() {})
	if st := b.Stats(); st.SRQPosted != DefaultRecvQueueSize {
		t.Fatalf("SRQ posted %d, want %d", st.SRQPosted, DefaultRecvQueueSize)
	}
	if fs := fab.Stats(); fs.CompletionsAfterDestroy != 0 || fs.DestroyedQPOps != 0 || fs.CQOverflows != 0 {
		t.Fatalf("fabric: %d completions after destroy, %d destroyed-QP ops, %d overflows",
			fs.CompletionsAfterDestroy, fs.DestroyedQPOps, fs.CQOverflows)
	}
}

// TestRacePacketsQueuedDuringConnect (docs/linux.md §3.6, §10 row 4, the
// 2018 start_xmit vs REP handler race): three frames sent while the REP is
// held are parked; frames the host reader has already read when the REP
// handler marks the connection up wait for it, and go out behind the
// parked ones. All nine arrive, in order; none is left parked.
func TestRacePacketsQueuedDuringConnect(t *testing.T) {
	fab := raceFabric(t, soft.Config{Seed: 33})
	pa, pb := newRacePort(1), rvNewCapture(2)
	recv := newRaceRecv()

	repHeld := make(chan struct{}, 1)
	releaseREP := make(chan struct{})
	type window struct {
		state    txState
		flushing bool
		taken    bool
	}
	inWindow := make(chan window, 1)
	var repWindow func(tc *txConn) window
	var mac frame.MAC
	src := frame.MAC(pa.mac)
	const parked, later = maxParked, 6
	// Both sides' CM waits a minute for answers: holding the REP must not
	// make either side retry or time out.
	var applying sync.Once
	a := raceStart(t, fab, "a", pa, func(c *Config, d *wrapDevice) {
		c.CM = rvSlowCM()
		// The connection's first send is its first parked frame, posted
		// by the REP handler with the connection just marked up and its
		// parked frames being posted: the later frames are handed to the
		// reader there, which reads them and then waits until the parked
		// ones are out.
		d.beforePost = func(ctx any, _ []hca.SendWR) {
			tc, ok := ctx.(*txConn)
			if !ok {
				return
			}
			applying.Do(func() { inWindow <- repWindow(tc) })
		}
	})
	repWindow = func(tc *txConn) window {
		var batch [][]byte
		for k := range later {
			batch = append(batch, raceFrame(mac, src, parked+1+k))
		}
		w := window{state: tc.state.load(), flushing: tc.flushed != nil}
		w.taken = pa.waitTaken(pa.push(batch...))
		return w
	}
	b := raceStart(t, fab, "b", pb, func(c *Config, d *wrapDevice) {
		c.CM = rvSlowCM()
		recv.observe(c, pb, d)
		// b's CM sends the REP: held there, a's REP handler waits for it
		// as for a slow answer.
		d.beforePost = func(_ any, wrs []hca.SendWR) {
			if h, err := cm.ParseMADHeader(wrs[0].Data); err != nil || h.AttributeID != uint16(cm.MsgREP) {
				return
			}
			select {
			case repHeld <- struct{}{}:
			default:
			}
			select {
			case <-releaseREP:
			case <-time.After(raceWait):
			}
		}
	})
	// A test that fails while the REP is held must not leave b's CM
	// goroutine in the device: Close (an earlier cleanup, so a later one
	// to run) would wait for it.
	letREPGo := sync.OnceFunc(func() { close(releaseREP) })
	t.Cleanup(letREPGo)
	mac = rvLearn(a, b.HWAddr(), netip.AddrFrom4(raceDstIP), time.Now())

	pa.waitHandled(t, pa.push(raceFrame(mac, src, 1)))
	recvOne(t, repHeld, "REP")
	tc := onlyTXConn(t, a)
	// The REP is held: the connection stays connecting while two more
	// frames are sent, one batch each.
	pa.push(raceFrame(mac, src, 2))
	pa.waitHandled(t, pa.push(raceFrame(mac, src, 3)))
	st := a.Stats()
	if len(st.Neighbours) != 1 || st.Neighbours[0].Parked != parked || st.Neighbours[0].TXConn != txConnecting.String() {
		t.Fatalf("while the REP is held: neighbours %+v, want %d frames parked on a connecting connection", st.Neighbours, parked)
	}
	if got := seqsWritten(pb); len(got) != 0 {
		t.Fatalf("frames %v reached b before the REP was applied", got)
	}
	letREPGo()
	w := recvOne(t, inWindow, "REP applied")
	if w.state != txUp || !w.flushing || !w.taken {
		t.Fatalf("in the REP handler: connection %s, flushing %v, later frames read %v; want up, true, true",
			w.state, w.flushing, w.taken)
	}
	for want := 1; want <= parked+later; want++ {
		got := recvOne(t, recv.packets, fmt.Sprintf("frame %d", want))
		if got.seq != want || !got.intact {
			t.Fatalf("b got frame %d (intact %v), want frame %d: parked frames must leave first, in order", got.seq, got.intact, want)
		}
	}
	st = a.Stats()
	if len(st.Neighbours) != 1 || st.Neighbours[0].Parked != 0 || st.Neighbours[0].TXConn != txUp.String() {
		t.Fatalf("after the REP: neighbours %+v, want nothing parked on an up connection", st.Neighbours)
	}
	if d := st.Drops["tx_neigh_queue_full"]; d != 0 {
		t.Fatalf("%d frames dropped as tx_neigh_queue_full", d)
	}
	if tc.packets.Load() != parked+later {
		t.Fatalf("connection sent %d packets, want %d", tc.packets.Load(), parked+later)
	}
}

// TestRaceQPNReusedWhileCompletionsQueued (docs/linux.md §10 row 8): an
// old passive connection's receive completion is still queued when its QP
// is gone and a new connection from the same peer got the same QPN. The
// old completion carries the old connection's context: it is dropped as
// dead, not delivered as the new connection's, and the new connection's
// packets arrive intact.
//
// The engine's own teardown cannot get here: the drain completion queues
// behind the old completions and the QP (and its QPN) lives until it is
// polled. A destroy with completions still queued is what Close's drain
// deadline does to a wedged backend; the SkipDrain mutation does it on every
// teardown, and is how this test reaches the state.
func TestRaceQPNReusedWhileCompletionsQueued(t *testing.T) {
	fab := raceFabric(t, soft.Config{Seed: 34, Faults: soft.Faults{ImmediateQPNReuse: true}})
	pa, pb := newRacePort(1), rvNewCapture(2)
	recv := newRaceRecv()
	txGone := make(chan Event, 8)
	repApplying := make(chan *txConn, 8)
	var sent sync.Map // *txConn -> its first send was seen
	a := raceStart(t, fab, "a", pa, func(c *Config, d *wrapDevice) {
		c.Events = eventsTo{EventTXDestroyed, txGone}
		// A connection's first send is its parked frame, posted by the
		// REP handler under Interface.mu.
		d.beforePost = func(ctx any, _ []hca.SendWR) {
			if tc, ok := ctx.(*txConn); ok {
				if _, dup := sent.LoadOrStore(tc, true); !dup {
					repApplying <- tc
				}
			}
		}
	})
	b := raceStart(t, fab, "b", pb, func(c *Config, d *wrapDevice) {
		recv.observe(c, pb, d)
		d.mut = mutation.Soak{SkipDrain: true}
	})
	mac := rvLearn(a, b.HWAddr(), netip.AddrFrom4(raceDstIP), time.Now())
	src := frame.MAC(pa.mac)

	pa.push(raceFrame(mac, src, 1))
	recvOne(t, repApplying, "first REP")
	if got := recvOne(t, recv.packets, "frame 1"); got.seq != 1 || !got.intact {
		t.Fatalf("b got %+v, want frame 1 intact", got)
	}
	old := onlyRXConn(t, b)
	qpn := old.qp.QPN()

	hold, err := fab.HoldCompletions(softCQ(b.rxCQ))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	pa.waitHandled(t, pa.push(raceFrame(mac, src, 2)))
	if p := fab.Stats().PendingCompletion; p != 1 {
		t.Fatalf("%d completions held, want frame 2's", p)
	}
	// Teardown destroys the QP at once (no drain); its DREQ makes a drop
	// its connection.
	if n := recvOne(t, killPassive(&testNode{ifc: b}), "teardown"); n != 1 {
		t.Fatalf("teardown moved %d connections, want 1", n)
	}
	if got := recv.reapedQPN(t); got != qpn {
		t.Fatalf("reaped QP %#x, want the old connection's %#x", got, qpn)
	}
	recvOne(t, txGone, "a's connection after the DREQ")

	// Frame 3 opens a new connection; b's new QP gets the freed QPN.
	pa.push(raceFrame(mac, src, 3))
	recvOne(t, repApplying, "second REP")
	// The REP handler held Interface.mu when it signalled: frame 4 is
	// handled after the parked frame 3 was posted. Both are delivered into
	// b's SRQ, their completions held behind frame 2's.
	pa.waitHandled(t, pa.push(raceFrame(mac, src, 4)))
	cur := onlyRXConn(t, b)
	if cur == old || cur.qp.QPN() != qpn {
		t.Fatalf("new connection %p on QPN %#x; want a new connection on the old QPN %#x", cur, cur.qp.QPN(), qpn)
	}
	if p := fab.Stats().PendingCompletion; p != 3 {
		t.Fatalf("%d completions held, want frames 2, 3 and 4", p)
	}

	hold.Release()
	// Three completions are held: collect what each became.
	var delivered []rxRecord
	var dead []hca.WC
	timeout := time.After(raceWait)
	for len(delivered)+len(dead) < 3 {
		select {
		case r := <-recv.packets:
			delivered = append(delivered, r)
		case wc := <-recv.dead:
			dead = append(dead, wc)
		case <-timeout:
			t.Fatalf("of 3 held completions %d delivered %+v, %d dropped dead", len(delivered), delivered, len(dead))
		}
	}
	if len(dead) != 1 || dead[0].QPN != qpn || dead[0].Context != any(old) || wrKind(dead[0].ID) != wrKindSRQRecv {
		t.Fatalf("dead completions %+v: want frame 2's alone, QPN %#x, the old connection's context (delivered %+v)", dead, qpn, delivered)
	}
	if fmt.Sprint(delivered) != fmt.Sprint([]rxRecord{{3, true}, {4, true}}) {
		t.Fatalf("delivered %+v, want frames 3 and 4 intact", delivered)
	}
	b.rxNAPI.Sync(func() {})
	noMore(t, recv.packets, "delivery")
	noMore(t, recv.dead, "dead completion")
	if got := seqsWritten(pb); fmt.Sprint(got) != "[1 3 4]" {
		t.Fatalf("host port got frames %v, want [1 3 4]", got)
	}
	if o, c := old.packets.Load(), cur.packets.Load(); o != 1 || c != 2 {
		t.Fatalf("old connection counted %d packets, new %d; want 1 and 2", o, c)
	}
	st := b.Stats()
	if st.Counters.RxDeadDropped != 1 || st.SRQPosted != DefaultRecvQueueSize {
		t.Fatalf("rx_dead_dropped %d, SRQ posted %d; want 1 and %d", st.Counters.RxDeadDropped, st.SRQPosted, DefaultRecvQueueSize)
	}
	// The reuse really happened with the old completion queued: it was
	// polled after its QP was destroyed.
	if fs := fab.Stats(); fs.CompletionsAfterDestroy != 1 || fs.DestroyedQPOps != 0 {
		t.Fatalf("fabric: %d completions after destroy (want 1), %d destroyed-QP ops", fs.CompletionsAfterDestroy, fs.DestroyedQPOps)
	}
}
