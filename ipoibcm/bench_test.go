package ipoibcm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// enginePair is two Interfaces on the soft fabric with in-memory host
// ports, the neighbours pre-learnt: what is measured is the engine alone.
type enginePair struct {
	fab       *soft.Fabric
	a, b      *Interface
	pa, pb    *memPort
	delivered atomic.Int64
	arrived   chan struct{}
	frame     []byte
}

// batchLimitedPort is a memPort whose reads fill at most batch frames:
// batch 1 is the kernel TAP, one frame per read.
type batchLimitedPort struct {
	*memPort
	batch int
}

func (p batchLimitedPort) BatchSize() int { return p.batch }

func newEnginePair(tb testing.TB, mode Mode, payload int, tweak ...func(*Config)) *enginePair {
	return newEnginePairBatch(tb, mode, payload, 0, tweak...)
}

// newEnginePairBatch is newEnginePair with a's host port reading at most
// batch frames at a time (0: the memPort's own batch).
func newEnginePairBatch(tb testing.TB, mode Mode, payload, batch int, tweak ...func(*Config)) *enginePair {
	return newEnginePairOn(tb, soft.Config{Seed: 12}, mode, payload, batch, tweak...)
}

// newEnginePairOn is newEnginePairBatch on a fabric made with fc.
func newEnginePairOn(tb testing.TB, fc soft.Config, mode Mode, payload, batch int, tweak ...func(*Config)) *enginePair {
	p := &enginePair{fab: soft.NewFabric(fc), arrived: make(chan struct{}, 1)}
	mk := func(name string, port HostPort) *Interface {
		dev, err := p.fab.NewDevice(name)
		if err != nil {
			tb.Fatal(err)
		}
		cfg := Config{Device: dev, Host: port, Mode: mode, CM: fastCM()}
		for _, f := range tweak {
			f(&cfg)
		}
		ifc, err := New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		if err := ifc.Start(); err != nil {
			tb.Fatal(err)
		}
		return ifc
	}
	p.pa = newMemPort(1, nil)
	p.pb = newMemPort(2, func(f [][]byte) {
		p.delivered.Add(int64(len(f)))
		select {
		case p.arrived <- struct{}{}:
		default:
		}
	})
	var hostA HostPort = p.pa
	if batch > 0 {
		hostA = batchLimitedPort{memPort: p.pa, batch: batch}
	}
	p.a, p.b = mk("a", hostA), mk("b", p.pb)
	p.a.neigh.mu.Lock()
	n := p.a.neigh.learn(p.b.HWAddr(), netip.Addr{}, time.Now())
	p.a.neigh.mu.Unlock()
	p.frame = make([]byte, frame.EthHdrLen+payload)
	frame.PutEthernet(p.frame, frame.EthHeader{Dst: n.mac, Src: frame.MAC(p.pa.mac), EtherType: frame.EtherTypeIPv4})
	ip := p.frame[frame.EthHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(payload))
	ip[8], ip[9] = 64, 17
	copy(ip[12:16], []byte{10, 0, 0, 1})
	copy(ip[16:20], []byte{10, 0, 0, 2})
	tb.Cleanup(func() {
		p.a.Close()
		p.b.Close()
		p.fab.Close()
	})
	return p
}

// await waits until cond holds, for state the engine raises no event for
// (its counters); it reads them again every millisecond. The deadline only
// turns a hang into a failure that says what was awaited.
func (p *enginePair) await(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	awaitCond(tb, what, cond, func() string {
		st := p.a.Stats()
		return fmt.Sprintf("a: outstanding %d, %+v, %+v, drops %v", p.a.tx.outstanding.Load(), st.Counters, st.Reaper, st.Drops)
	})
}

// awaitDelivered waits until b's host got n frames in all.
func (p *enginePair) awaitDelivered(tb testing.TB, n int64) {
	tb.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for p.delivered.Load() < n {
		select {
		case <-p.arrived:
		case <-deadline.C:
			tb.Fatalf("delivered %d of %d; a: %+v %v", p.delivered.Load(), n, p.a.Stats().Counters, p.a.Stats().Drops)
		}
	}
}

// send pushes n frames in windows of w and waits until all arrived.
func (p *enginePair) send(tb testing.TB, n, w int) {
	start := p.delivered.Load()
	for sent := 0; sent < n; {
		k := min(w, n-sent)
		for range k {
			p.pa.in <- p.frame
		}
		sent += k
		deadline := time.After(10 * time.Second)
		for p.delivered.Load()-start < int64(sent) {
			select {
			case <-p.arrived:
			case <-deadline:
				tb.Fatalf("delivered %d of %d; a: %+v %v", p.delivered.Load()-start, sent, p.a.Stats().Counters, p.a.Stats().Drops)
			}
		}
	}
}

// BenchmarkEngine: frames in on one host port, out of the other, through
// both engines and the soft fabric. The fabric receives newest-first, as
// 'ipoib fabric' and the bench package run it (cmd/ipoib/internal/cli/lab_soft.go,
// bench/inproc_ib.go): its copy stands in for an HCA's DMA, which costs the
// CPU no cache. The oldest-first cases keep the cost of a FIFO receive
// queue in sight: each datagram lands in the buffer posted a UD ring's
// depth (4096) of receives ago, whose lines left the cache long before
// (docs/performance.md, "BenchmarkEngine in datagram mode").
func BenchmarkEngine(b *testing.B) {
	for _, c := range []struct {
		mode    Mode
		payload int
		order   soft.ReceiveOrder
	}{
		{ModeConnected, 65000, soft.ReceiveNewestFirst}, {ModeConnected, 1500, soft.ReceiveNewestFirst},
		{ModeDatagram, 4000, soft.ReceiveNewestFirst}, {ModeDatagram, 1500, soft.ReceiveNewestFirst},
		{ModeDatagram, 4000, soft.ReceiveOldestFirst}, {ModeDatagram, 1500, soft.ReceiveOldestFirst},
	} {
		name := fmt.Sprintf("%s-%d", c.mode, c.payload)
		if c.order != soft.ReceiveNewestFirst {
			name += "-" + c.order.String()
		}
		b.Run(name, func(b *testing.B) {
			p := newEnginePairOn(b, soft.Config{Seed: 12, ReceiveOrder: c.order}, c.mode, c.payload, 0)
			p.send(b, 1, 1) // connection up (one parked frame)
			p.send(b, 256, 64)
			b.SetBytes(int64(c.payload))
			b.ReportAllocs()
			b.ResetTimer()
			p.send(b, b.N, 64)
		})
	}
}

func TestEngineDataPathAllocs(t *testing.T) {
	p := newEnginePair(t, ModeConnected, 8000)
	p.send(t, 1, 1)
	p.send(t, 256, 64)
	allocs := testing.AllocsPerRun(20, func() { p.send(t, 64, 64) })
	if perFrame := allocs / 64; perFrame > 0.1 {
		t.Fatalf("%.2f allocations per frame in steady state", perFrame)
	}
	if st := p.a.Stats(); len(st.TXConns) != 1 {
		t.Fatalf("not connected: %+v", st.TXConns)
	}
}

// TestTXCreditsStopAndWake drives the global TX credits to their limit
// and back without depending on timing: the fabric holds every send
// completion of a's TX CQ and lets them through only when the test says,
// so sends stay outstanding however fast the reader busy-polls. The host
// port hands the reader one frame per read, as the kernel TAP does. Each
// cycle checks, in a state that cannot move while it is checked:
//   - the reader stops at exactly SendQueueSize-1 outstanding and leaves
//     the rest of the host's frames unread (none lost);
//   - completions that leave more than half outstanding do not wake it;
//   - the one that brings the count to half does (a wake, not a lost
//     wake-up), and the reader fills the credits and stops again;
//   - once every completion is let through, every frame is sent and
//     delivered and the credits are back to zero.
func TestTXCreditsStopAndWake(t *testing.T) {
	for _, mode := range []Mode{ModeConnected, ModeDatagram} {
		t.Run(mode.String(), func(t *testing.T) {
			const (
				sendQueue = 8
				limit     = sendQueue - 1 // outstanding at which the reader stops
				half      = sendQueue / 2 // outstanding at which it resumes
				frames    = 40            // per cycle: several times what the credits allow
				cycles    = 3
			)
			p := newEnginePairBatch(t, mode, 3000, 1, func(c *Config) { c.SendQueueSize = sendQueue })
			p.send(t, 1, 1) // connection up (one parked frame)
			p.await(t, "the warm-up send's credit back", func() bool {
				return p.a.tx.outstanding.Load() == 0 && p.a.Stats().Counters.TxPackets == 1
			})
			sent := uint64(1) // frames whose completion was reaped
			// check asserts the stopped state: nothing moves while the
			// completions are held and the reader is stopped.
			check := func(cycle int, what string, outstanding, unread int, stops, wakes, txPackets uint64) {
				t.Helper()
				st := p.a.Stats()
				if !p.a.tx.gates[0].stopped.Load() {
					t.Fatalf("cycle %d, %s: reader not stopped", cycle, what)
				}
				if got := p.a.tx.outstanding.Load(); got != int64(outstanding) {
					t.Fatalf("cycle %d, %s: %d outstanding, want %d", cycle, what, got, outstanding)
				}
				if got := len(p.pa.in); got != unread {
					t.Fatalf("cycle %d, %s: %d frames left unread, want %d", cycle, what, got, unread)
				}
				if st.Reaper.TXQueueStops != stops || st.Reaper.TXQueueWakes != wakes {
					t.Fatalf("cycle %d, %s: stops %d wakes %d, want %d and %d", cycle, what, st.Reaper.TXQueueStops, st.Reaper.TXQueueWakes, stops, wakes)
				}
				if st.Counters.TxPackets != txPackets || st.Counters.TxDropped != 0 {
					t.Fatalf("cycle %d, %s: tx_packets %d tx_dropped %d, want %d and 0", cycle, what, st.Counters.TxPackets, st.Counters.TxDropped, txPackets)
				}
			}
			for cycle := range cycles {
				base := p.a.Stats().Reaper
				hold, err := p.fab.HoldCompletions(p.a.txCQ)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(hold.Release) // before Close, if the cycle fails
				for range frames {
					p.pa.in <- p.frame
				}
				p.await(t, "the reader to stop the queue", func() bool {
					return p.a.Stats().Reaper.TXQueueStops > base.TXQueueStops && p.a.tx.gates[0].stopped.Load()
				})
				check(cycle, "at the limit", limit, frames-limit, base.TXQueueStops+1, base.TXQueueWakes, sent)
				if fs := p.fab.Stats(); fs.PendingCompletion != limit {
					t.Fatalf("cycle %d: fabric holds %d completions, want %d", cycle, fs.PendingCompletion, limit)
				}
				p.awaitDelivered(t, int64(sent)+limit) // the sends themselves went out

				// Down to one above half: still stopped. Once the count
				// shows the credits returned, Sync waits out the poll that
				// returned them, wake decision included.
				if got := hold.Pass(limit - half - 1); got != limit-half-1 {
					t.Fatalf("cycle %d: passed %d completions, want %d", cycle, got, limit-half-1)
				}
				p.await(t, "the passed completions' credits back", func() bool {
					// A wake ends the wait too: check then says what went wrong.
					return p.a.tx.outstanding.Load() == half+1 || p.a.Stats().Reaper.TXQueueWakes != base.TXQueueWakes
				})
				p.a.tx.napi.Sync(func() {})
				check(cycle, "above half", half+1, frames-limit, base.TXQueueStops+1, base.TXQueueWakes, sent+limit-half-1)

				// Down to half: woken. The completions are still held, so
				// the reader fills the credits again and stops.
				if got := hold.Pass(1); got != 1 {
					t.Fatalf("cycle %d: passed %d completions, want 1", cycle, got)
				}
				p.await(t, "the reader to be woken and stop again", func() bool {
					r := p.a.Stats().Reaper
					return r.TXQueueWakes > base.TXQueueWakes && r.TXQueueStops > base.TXQueueStops+1 && p.a.tx.gates[0].stopped.Load()
				})
				refill := limit - half
				check(cycle, "stopped again", limit, frames-limit-refill, base.TXQueueStops+2, base.TXQueueWakes+1, sent+limit-half)
				p.awaitDelivered(t, int64(sent)+limit+int64(refill))

				hold.Release()
				sent += frames
				p.await(t, "every frame sent and every credit back", func() bool {
					c := p.a.Stats().Counters
					return c.TxPackets+c.TxDropped == sent && p.a.tx.outstanding.Load() == 0 && len(p.pa.in) == 0
				})
				p.awaitDelivered(t, int64(sent))
				if st := p.a.Stats(); st.Counters.TxDropped != 0 || nonZero(st.Drops) != 0 {
					t.Fatalf("cycle %d: tx_dropped %d, drops %v; want none on a fault-free fabric", cycle, st.Counters.TxDropped, st.Drops)
				}
			}
			st := p.a.Stats()
			if st.Reaper.TXQueueStops < 2*cycles || st.Reaper.TXQueueWakes < 2*cycles || st.Reaper.TXQueueWakes > st.Reaper.TXQueueStops {
				t.Fatalf("stops %d wakes %d after %d cycles of two stops each", st.Reaper.TXQueueStops, st.Reaper.TXQueueWakes, cycles)
			}
			if got := p.delivered.Load(); got != int64(sent) {
				t.Fatalf("b's host got %d frames, a sent %d", got, sent)
			}
		})
	}
}

// TestTXCreditsUnderCompletionDelay is the randomized flavour: completions
// lag the sender by chance, frames come in batches, and whether the queue
// stops at all is left to the scheduler, so only what must hold however
// it went is asserted: the reader never wedges (every frame the host wrote
// is accounted for as sent or under a named drop, and the credits return
// to zero). The wire may lose frames: UD has no flow control, and RC with
// rnr_retry 0 tears a connection down when the receiver's SRQ runs dry,
// Linux's behaviour too.
func TestTXCreditsUnderCompletionDelay(t *testing.T) {
	for _, mode := range []Mode{ModeConnected, ModeDatagram} {
		t.Run(mode.String(), func(t *testing.T) {
			const frames = 2000
			p := newEnginePair(t, mode, 3000, func(c *Config) { c.SendQueueSize = 8 })
			p.send(t, 1, 1)
			p.fab.SetFaults(soft.Faults{CompletionDelay: soft.CompletionDelay{Probability: 0.5, Max: 200 * time.Microsecond}})
			for range frames {
				p.pa.in <- p.frame
			}
			p.await(t, "every frame accounted for and every credit back", func() bool {
				c := p.a.Stats().Counters
				return c.TxPackets+c.TxDropped == frames+1 && p.a.tx.outstanding.Load() == 0
			})
			st := p.a.Stats()
			t.Logf("stops %d wakes %d, delivered %d of %d, drops %v", st.Reaper.TXQueueStops, st.Reaper.TXQueueWakes, p.delivered.Load(), frames+1, st.Drops)
		})
	}
}

// TestReaderReapsTXCompletions: on the soft fabric an RC send completes
// inside PostSend, so in steady state the host reader's busy poll reaps
// every send completion and the TX poller's goroutine is not woken for
// them, while the RX side still is (its events now run inline in the
// sender's PostSend instead of on the fabric's dispatcher).
func TestReaderReapsTXCompletions(t *testing.T) {
	const frames = 2000
	p := newEnginePair(t, ModeConnected, 8000)
	p.send(t, 1, 1)
	p.send(t, 64, 64)
	before := p.a.Stats().NAPI.TX
	p.send(t, frames, 1) // one frame at a time, like the kernel TAP
	after := p.a.Stats().NAPI.TX
	busy := after.BusyPolls - before.BusyPolls
	wakes := after.Wakeups - before.Wakeups
	reaped := after.Completions - before.Completions
	if reaped < frames-64 {
		// A few may still be in flight; all but a batch are reaped.
		t.Fatalf("TX completions %d of %d sent", reaped, frames)
	}
	if busy < frames/2 || wakes > frames/20 {
		t.Fatalf("busy polls %d, TX poller wake-ups %d for %d frames; want the reader to reap (busy >= %d, wakes <= %d)",
			busy, wakes, frames, frames/2, frames/20)
	}
	fs := p.fab.Stats()
	if fs.InlineEvents == 0 {
		t.Fatalf("no completion event delivered inline: %+v", fs)
	}
	if c := p.a.Stats().Counters; c.TxPackets < frames {
		t.Fatalf("tx_packets %d < %d", c.TxPackets, frames)
	}
	t.Logf("TX: busy polls %d (contended %d), wake-ups %d, left unarmed %d, busy-poll ends %d; fabric inline events %d dispatched %d",
		busy, after.BusyPollsContended-before.BusyPollsContended, wakes, after.LeftUnarmed-before.LeftUnarmed,
		after.BusyPollEnds-before.BusyPollEnds, fs.InlineEvents, fs.DispatchedEvents)
}

// nonZero counts the drop reasons that counted something.
func nonZero(drops map[string]uint64) int {
	n := 0
	for _, v := range drops {
		if v != 0 {
			n++
		}
	}
	return n
}
