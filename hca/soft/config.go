package soft

import (
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// Config configures a Fabric.
type Config struct {
	// Seed seeds the fault-injection random source; equal seeds and equal
	// operation sequences give equal faults.
	Seed int64
	// MTU is every port's active MTU (default 4096); UD messages above it
	// are dropped.
	MTU hca.MTU
	// NoOffloads makes every device report no checksum offload and no UD
	// LSO, as an HCA without them, so consumers' software fallbacks can
	// be exercised.
	NoOffloads bool
	// PKey is the single entry of every device's P_Key table (default 0xFFFF).
	PKey hca.PKey
	// TimerScale multiplies the IBTA RNR timer and transport timeout
	// durations. Zero means 1 (the real table); tests use e.g. 0.001.
	TimerScale float64
	// Faults is the initial fault-injection setting; see Fabric.SetFaults.
	Faults Faults
	// ReceiveOrder is which posted receive buffer a message lands in
	// (default: the oldest, as rxe and hardware do).
	ReceiveOrder ReceiveOrder
	// Tap, if set, sees every message the fabric carries (ipoib capture).
	Tap Tap
}

// ReceiveOrder selects which posted receive buffer of a receive queue (a
// QP's own or an SRQ) the next message consumes.
//
//go:generate go tool stringer -type=ReceiveOrder -linecomment
type ReceiveOrder int

const (
	// ReceiveOldestFirst consumes buffers in posted order (the default).
	ReceiveOldestFirst ReceiveOrder = iota // oldest-first
	// ReceiveNewestFirst consumes the most recently posted buffer first.
	// A hardware HCA writes receive buffers by DMA, which costs no CPU
	// cache; this fabric's "wire" is a CPU copy, and cycling through every
	// posted buffer (an IPoIB SRQ is 256 x 64 KiB) makes each copy miss
	// the cache. Newest-first keeps the few buffers a consumer recycles
	// hot, about halving the copy cost of bulk traffic. Flushes (a QP moved
	// to Error) still complete in posted order.
	ReceiveNewestFirst // newest-first
)

// DestroyPolicy says what happens to a destroyed QP's completions that are
// still queued on a CQ.
//
//go:generate go tool stringer -type=DestroyPolicy -linecomment
type DestroyPolicy int

const (
	// LeaveCompletionsAfterDestroy keeps them; Poll returns them later with
	// the QP's context (IBTA permits it, rxe does it). The default.
	LeaveCompletionsAfterDestroy DestroyPolicy = iota // leave
	// PurgeCompletionsOnDestroy removes them from the CQ (and from the
	// delayed-completion queue), as mlx5 does for kernel QPs.
	PurgeCompletionsOnDestroy // purge
)

// CompletionDelay holds completions back and releases them later from the
// scheduler goroutine.
type CompletionDelay struct {
	// Probability that a completion (and therefore everything behind it on
	// the same CQ) is held back.
	Probability float64
	// Max is the upper bound of the extra delay of a held completion.
	Max time.Duration
}

// Faults selects the misbehaviours the fabric injects. The zero value
// injects nothing.
type Faults struct {
	CompletionDelay CompletionDelay
	// DestroyedQPCompletions: leave (default) or purge a destroyed QP's CQEs.
	DestroyedQPCompletions DestroyPolicy
	// ImmediateQPNReuse hands a just-freed QPN to the next CreateQP instead
	// of allocating cyclically.
	ImmediateQPNReuse bool
	// UDLoss is the probability that a UD delivery (per destination QP) is
	// lost.
	UDLoss float64
	// LastWQEDelay delays LAST_WQE_REACHED by this much.
	LastWQEDelay time.Duration
	// SpuriousCompletionEvents is the probability that arming a CQ fires
	// its completion handler at once although nothing new arrived.
	SpuriousCompletionEvents float64
	// RNR is the probability that an RC receive finds "no buffer" even when
	// one is posted.
	RNR float64
}

// withDefaults fills zero fields and replaces out-of-range ones (an MTU
// that is not an IB MTU, a negative TimerScale) by their defaults.
func (c Config) withDefaults() Config {
	if !c.MTU.Valid() {
		c.MTU = hca.MTU4096
	}
	if c.PKey == 0 {
		c.PKey = hca.PKeyDefault
	}
	if c.TimerScale <= 0 {
		c.TimerScale = 1
	}
	return c
}

// rnrTimerMicros is the IBTA RNR NAK timer table (Vol 1 table 45), in
// microseconds, indexed by the 5-bit timer code; code 0 is the longest.
var rnrTimerMicros = [32]float64{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960,
	1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
	40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// defaultTimeoutCode stands in for Timeout 0 ("infinite" in IBTA): an
// infinite timer would wedge a sender whose peer vanished, so we use the
// common CM default of 14 (about 67 ms).
const defaultTimeoutCode = 14

func (c *Config) rnrDelay(code uint8) time.Duration {
	return time.Duration(rnrTimerMicros[code&31] * c.TimerScale * float64(time.Microsecond))
}

// transportTimeout is 4.096 us * 2^code.
func (c *Config) transportTimeout(code uint8) time.Duration {
	if code == 0 {
		code = defaultTimeoutCode
	}
	return time.Duration(4096 * float64(uint64(1)<<(code&31)) * c.TimerScale)
}
