package ipoibcm

import (
	"encoding/binary"
	"fmt"
	"runtime"
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

func newEnginePair(tb testing.TB, mode Mode, payload int, tweak ...func(*Config)) *enginePair {
	p := &enginePair{fab: soft.NewFabric(soft.Config{Seed: 12}), arrived: make(chan struct{}, 1)}
	mk := func(name string, port *memPort) *Interface {
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
	p.a, p.b = mk("a", p.pa), mk("b", p.pb)
	p.a.mu.Lock()
	n := p.a.learnLocked(p.b.HWAddr(), netipZero, time.Now())
	p.a.mu.Unlock()
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
// both engines and the soft fabric.
func BenchmarkEngine(b *testing.B) {
	for _, c := range []struct {
		mode    Mode
		payload int
	}{{ModeConnected, 65000}, {ModeConnected, 1500}, {ModeDatagram, 4000}, {ModeDatagram, 1500}} {
		b.Run(fmt.Sprintf("%s-%d", c.mode, c.payload), func(b *testing.B) {
			p := newEnginePair(b, c.mode, c.payload)
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

// With 8 send credits the reader must stop and be woken by completions
// many times and never wedge (no lost wake-up): every frame the host
// wrote is accounted for as sent or as a named drop (the wire may lose
// some: UD has no flow control, and RC with rnr_retry 0 tears a connection
// down when the receiver's SRQ runs dry, Linux's behaviour too), and the
// credits return to zero. The fabric delays completions: sends that
// complete inside PostSend are reaped by the reader's busy poll and would
// never fill the queue.
func TestTXCreditsStopAndWake(t *testing.T) {
	for _, mode := range []Mode{ModeConnected, ModeDatagram} {
		t.Run(mode.String(), func(t *testing.T) {
			const frames = 5000
			p := newEnginePair(t, mode, 3000, func(c *Config) { c.SendQueueSize = 8 })
			p.send(t, 1, 1)
			p.fab.SetFaults(soft.Faults{CompletionDelay: soft.CompletionDelay{Probability: 0.5, Max: 200 * time.Microsecond}})
			base := Counters{} // the warm-up frame is part of the count
			for range frames {
				p.pa.in <- p.frame
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				c := p.a.Stats().Counters
				if c.TxPackets-base.TxPackets+c.TxDropped-base.TxDropped == frames+1 && p.a.outstanding.Load() == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("accounted %d of %d frames, outstanding %d; %v", c.TxPackets-base.TxPackets+c.TxDropped-base.TxDropped, frames+1, p.a.outstanding.Load(), p.a.Stats().Drops)
				}
				p.a.txNAPI.Sync(runtime.Gosched)
			}
			st := p.a.Stats()
			if st.Reaper.TXQueueStops == 0 || st.Reaper.TXQueueWakes == 0 {
				t.Fatalf("queue never stopped/woke: %+v", st.Reaper)
			}
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
