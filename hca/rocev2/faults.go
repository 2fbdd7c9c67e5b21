package rocev2

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Faults are seeded, reproducible UDP-layer faults applied to outgoing
// datagrams. Probabilities are in [0, 1]; each datagram meets at most one
// of drop, delay and duplicate, and may be reordered with its successor.
type Faults struct {
	Seed uint64
	// Drop loses a datagram.
	Drop float64
	// Duplicate sends a datagram twice.
	Duplicate float64
	// Reorder swaps a datagram with the next one of the same write batch.
	Reorder float64
	// Delay holds a datagram for DelayTime, so datagrams written after it,
	// in later batches too, overtake it.
	Delay float64
	// DelayTime is how long a delayed datagram is held; 0 means 1 ms.
	DelayTime time.Duration
	// UDLossOnly spares UD datagrams every fault but Drop. Duplication,
	// reordering and delay are what a connection's transport must absorb
	// (PSNs, go-back-N); a UD datagram carries a consumer's message, such
	// as an IP packet, which an IB subnet delivers at most once and, on
	// one path, in order. Off: every datagram meets every fault.
	UDLossOnly bool

	// HoldCompletion is the one fault below the UDP layer: the
	// probability that a completion (and every later one of the same CQ)
	// waits up to HoldCompletionMax before it enters its CQ, so it can
	// arrive after its QP was moved to Error or destroyed, as on a real
	// HCA (hold.go). It leaves GSO on.
	HoldCompletion float64
	// HoldCompletionMax bounds a held completion's wait; 0 means 4 ms.
	HoldCompletionMax time.Duration
}

// active reports whether any UDP-layer fault is on.
func (f Faults) active() bool { return f.Drop > 0 || f.Duplicate > 0 || f.Reorder > 0 || f.Delay > 0 }

func (f *Faults) normalize() error {
	for _, p := range []float64{f.Drop, f.Duplicate, f.Reorder, f.Delay, f.HoldCompletion} {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("fault probability %v not in [0, 1]", p)
		}
	}
	if f.DelayTime < 0 || f.HoldCompletionMax < 0 {
		return fmt.Errorf("fault delay times %v, %v: negative", f.DelayTime, f.HoldCompletionMax)
	}
	if f.DelayTime == 0 {
		f.DelayTime = time.Millisecond
	}
	if f.HoldCompletionMax == 0 {
		f.HoldCompletionMax = 4 * time.Millisecond
	}
	return nil
}

// faultAction is what the injector decided for one datagram.
//
//go:generate go tool stringer -type=faultAction -linecomment
type faultAction uint8

const (
	faultNone      faultAction = iota // none
	faultDrop                         // drop
	faultDelay                        // delay
	faultDuplicate                    // duplicate
)

// heldDatagram is a delayed datagram waiting for its release time.
type heldDatagram struct {
	buf []byte
	to  netip.Addr
	src *udpSocket
	due time.Time
}

// faultInjector decides the fate of each outgoing datagram and keeps the
// delayed ones. It is guarded by Device.txMu.
type faultInjector struct {
	cfg  Faults
	rng  *rand.Rand
	held []heldDatagram
	// spare buffers for held copies: a held datagram cannot keep the
	// device's packet buffer, which is recycled right after the write.
	spare [][]byte
}

func newFaultInjector(f Faults) *faultInjector {
	return &faultInjector{cfg: f, rng: rand.New(rand.NewPCG(f.Seed, f.Seed^0x9E3779B97F4A7C15))}
}

// reorder reports whether a datagram swaps places with its successor.
func (fi *faultInjector) reorder() bool {
	return fi.cfg.Reorder > 0 && fi.rng.Float64() < fi.cfg.Reorder
}

// mayDisturb reports whether a datagram may be duplicated, reordered or
// delayed (Faults.UDLossOnly spares UD ones).
func (fi *faultInjector) mayDisturb(pkt []byte) bool {
	return !fi.cfg.UDLossOnly || !isUD(pkt)
}

// isUD reports whether a RoCEv2 payload is a UD datagram.
func isUD(pkt []byte) bool { return len(pkt) > 0 && wire.Opcode(pkt[0]) == wire.OpUDSendOnly }

// decide draws the fate of one datagram. One draw per datagram keeps the
// sequence of decisions a function of the seed and the traffic alone.
func (fi *faultInjector) decide() faultAction {
	x := fi.rng.Float64()
	switch f := fi.cfg; {
	case x < f.Drop:
		return faultDrop
	case x < f.Drop+f.Delay:
		return faultDelay
	case x < f.Drop+f.Delay+f.Duplicate:
		return faultDuplicate
	}
	return faultNone
}

// hold copies a datagram into the delay queue, due at now+DelayTime (a
// zero-copy one whole: its send buffer is not the queue's to keep).
func (fi *faultInjector) hold(p *txPacket, now time.Time) {
	var c []byte
	if n := len(fi.spare); n > 0 {
		c = fi.spare[n-1][:0]
		fi.spare = fi.spare[:n-1]
	}
	if p.payload == nil {
		c = append(c, p.buf...)
	} else {
		c = append(append(append(c, p.buf[:p.split]...), p.payload...), p.buf[p.split:]...)
	}
	fi.held = append(fi.held, heldDatagram{buf: c, to: p.to, src: p.src, due: now.Add(fi.cfg.DelayTime)})
}

// release stages the held datagrams due by now on s, as many as its
// batch takes, and returns how many. Held datagrams keep their order and
// all have the same delay, so the queue is sorted by due time.
func (fi *faultInjector) release(now time.Time, s *sender) int {
	i := 0
	for ; i < len(fi.held) && !fi.held[i].due.After(now); i++ {
		if !s.stage(fi.held[i].buf, fi.held[i].to, fi.held[i].src) {
			break
		}
	}
	return i
}

// recycle returns the first n held datagrams' buffers after they were
// written and removes them from the queue.
func (fi *faultInjector) recycle(n int) {
	for i := range n {
		fi.spare = append(fi.spare, fi.held[i].buf)
		fi.held[i] = heldDatagram{}
	}
	rest := copy(fi.held, fi.held[n:])
	clear(fi.held[rest:])
	fi.held = fi.held[:rest]
}

// nextDue is the earliest held datagram's release time, zero if none.
func (fi *faultInjector) nextDue() time.Time {
	if len(fi.held) == 0 {
		return time.Time{}
	}
	return fi.held[0].due
}
