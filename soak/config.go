package soak

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/mutation"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// Config configures Run. Zero fields take the defaults of
// DefaultConfig; durations are small so reaping happens many times a
// second.
type Config struct {
	Hosts int
	// Duration is how long the traffic runs; with Until, the longest.
	Duration time.Duration
	Seed     int64
	// Until, if set, ends the traffic early: it is asked every CheckEvery
	// and the soak stops at its first true. Tests use it to run until
	// enough reaps (or violations) happened instead of for a wall-clock
	// time that a loaded machine fills with less work.
	Until func(Progress) bool

	// HCA is the backend: HCASoft (default) or HCARoCEv2.
	HCA string
	// Faults is the soft fabric's fault injection (delayed completions,
	// completions left after destroy, QPN reuse, RNR, UD loss, LAST_WQE
	// delay, spurious completion events).
	Faults soft.Faults
	// TimerScale scales the soft fabric's RNR and transport timers.
	TimerScale float64
	// RoCEv2 configures the RoCEv2 backend.
	RoCEv2 RoCEv2

	// Engine timing: the passive LRU, TX neighbour aging, CM.
	StaleAfter, StaleScan, StaleUpdate time.Duration
	NeighbourTimeout                   time.Duration
	DrainTimeout                       time.Duration
	CMResponseTimeout, CMTimeWait      time.Duration
	CMBackoff                          time.Duration

	// Queue sizes: small, to provoke RNR and credit stops.
	SendQueueSize, RecvQueueSize int
	// HostBatch is each host port's batch size; HostQueue how many frames
	// a host queues for its engine before the traffic generator waits.
	HostBatch, HostQueue int

	// Traffic: bursts of 1..BurstMax packets of IP size up to MaxPacket,
	// to the previous peer with probability RepeatPeer, then idle.
	BurstMax  int
	MaxPacket int
	// FirstPacketPause is the pause after a burst's first packet.
	FirstPacketPause time.Duration
	RepeatPeer       float64
	// ReARP is the probability of resolving a known peer again.
	ReARP      float64
	ARPTimeout time.Duration

	// HeapGrowth bounds HeapInuse to start*HeapGrowth + HeapSlack.
	HeapGrowth float64
	HeapSlack  uint64
	// QuiesceTimeout bounds each wait at the end (traffic drained, idle
	// connections reaped, goroutines gone).
	QuiesceTimeout time.Duration
	// CheckEvery is the period of the continuous checks.
	CheckEvery time.Duration

	// Capture, if set, keeps a ring of the last CapturePackets messages
	// and engine events (DefaultCapturePackets if 0) and writes it to
	// this pcapng file if an invariant breaks.
	Capture        string
	CapturePackets int
	// Metrics, if set, serves the soak's Prometheus metrics on this
	// address while it runs.
	Metrics string

	// Mutations switch off a teardown safeguard of every engine; the soak
	// must then report violations (internal/mutation).
	Mutations mutation.Soak

	// Progress receives the live progress line (nil: none). With
	// ProgressTTY the line is rewritten in place every CheckEvery,
	// otherwise a line is printed every ProgressEvery.
	Progress      io.Writer
	ProgressTTY   bool
	ProgressEvery time.Duration

	Logger *slog.Logger
}

// RoCEv2 configures the RoCEv2 backend of a soak: one device per
// host on its own loopback address and socket (rocev2.Loopback).
type RoCEv2 struct {
	// IPv6 puts the devices on IPv6 addresses (needs CAP_SYS_ADMIN for a
	// private network namespace; IPv4 needs no privilege).
	IPv6 bool `json:"ipv6"`
	// Faults are every device's UDP-layer faults and held completions;
	// their seed is derived from Config.Seed and the host's index.
	Faults rocev2.Faults `json:"faults"`
	// MinAckTimeout is the floor of the RC transport timeout.
	MinAckTimeout time.Duration `json:"min_ack_timeout_ns"`
	// TimeScale scales the transport timeout and the RNR timer.
	TimeScale float64 `json:"time_scale"`
}

// Progress is what Config.Until sees: the engines' reaper
// counters summed over every interface, and the violations so far by
// invariant name (see Report.Invariants).
type Progress struct {
	Elapsed    time.Duration
	Engine     ipoibcm.ReaperStats
	Violations map[string]uint64
}

// DefaultConfig is the configuration `ipoib soak` starts from.
func DefaultConfig() Config {
	return Config{
		Hosts:    64,
		Duration: 30 * time.Second,
		Seed:     1,
		HCA:      HCASoft,
		RoCEv2: RoCEv2{
			// Loss, duplication, reordering and delay of RC datagrams,
			// which go-back-N must absorb; UD (ARP, and IP packets while
			// a peer has no connection) is only lost, as on an IB subnet.
			// A held completion (the soft fabric's delayed completion)
			// can reach its CQ after its QP was destroyed.
			Faults: rocev2.Faults{
				Drop: 0.005, Duplicate: 0.005, Reorder: 0.01, Delay: 0.005, DelayTime: 2 * time.Millisecond,
				UDLossOnly:     true,
				HoldCompletion: 0.02, HoldCompletionMax: 4 * time.Millisecond,
			},
			// Loopback round trips are microseconds; the floor is the
			// retransmit delay after a lost tail packet.
			MinAckTimeout: 20 * time.Millisecond,
			TimeScale:     0.01,
		},
		Faults: soft.Faults{
			CompletionDelay:          soft.CompletionDelay{Probability: 0.02, Max: 4 * time.Millisecond},
			DestroyedQPCompletions:   soft.LeaveCompletionsAfterDestroy,
			ImmediateQPNReuse:        true,
			UDLoss:                   0.01,
			LastWQEDelay:             3 * time.Millisecond,
			SpuriousCompletionEvents: 0.01,
			RNR:                      0.002,
		},
		TimerScale:        0.01,
		StaleAfter:        40 * time.Millisecond,
		StaleScan:         10 * time.Millisecond,
		StaleUpdate:       20 * time.Millisecond,
		NeighbourTimeout:  150 * time.Millisecond,
		DrainTimeout:      2 * time.Second,
		CMResponseTimeout: 50 * time.Millisecond,
		CMTimeWait:        20 * time.Millisecond,
		CMBackoff:         200 * time.Millisecond,
		SendQueueSize:     16,
		RecvQueueSize:     16,
		HostBatch:         8,
		HostQueue:         32,
		BurstMax:          24,
		FirstPacketPause:  2 * time.Millisecond,
		MaxPacket:         65520,
		RepeatPeer:        0.4,
		ReARP:             0.02,
		ARPTimeout:        30 * time.Millisecond,
		HeapGrowth:        2,
		HeapSlack:         128 << 20,
		QuiesceTimeout:    10 * time.Second,
		CheckEvery:        200 * time.Millisecond,
		ProgressEvery:     3 * time.Second,
	}
}

// Bounds of Config that Run enforces.
const (
	// MaxHosts: the hosts' addresses take two bytes of 250 values each.
	MaxHosts = 250 * 250
	// MinPacket is the smallest IP packet: IPv4, UDP and the soak header.
	MinPacket = soakMinIP
)

// ErrConfig is wrapped by Run for an unusable configuration.
var ErrConfig = errors.New("invalid soak configuration")

// withDefaults fills zero fields from DefaultConfig and checks ranges.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	fill := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	fillInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	fillInt(&c.Hosts, d.Hosts)
	if c.HCA == "" {
		c.HCA = d.HCA
	}
	fill(&c.Duration, d.Duration)
	if c.TimerScale <= 0 {
		c.TimerScale = d.TimerScale
	}
	fill(&c.StaleAfter, d.StaleAfter)
	fill(&c.StaleScan, d.StaleScan)
	if c.StaleUpdate <= 0 {
		c.StaleUpdate = c.StaleAfter / 2
	}
	fill(&c.NeighbourTimeout, d.NeighbourTimeout)
	fill(&c.DrainTimeout, d.DrainTimeout)
	fill(&c.CMResponseTimeout, d.CMResponseTimeout)
	fill(&c.CMTimeWait, d.CMTimeWait)
	fill(&c.CMBackoff, d.CMBackoff)
	fillInt(&c.SendQueueSize, d.SendQueueSize)
	fillInt(&c.RecvQueueSize, d.RecvQueueSize)
	fillInt(&c.HostBatch, d.HostBatch)
	fillInt(&c.HostQueue, d.HostQueue)
	fillInt(&c.BurstMax, d.BurstMax)
	fillInt(&c.MaxPacket, d.MaxPacket)
	if c.FirstPacketPause < 0 {
		c.FirstPacketPause = 0
	}
	fill(&c.ARPTimeout, d.ARPTimeout)
	if c.HeapGrowth <= 0 {
		c.HeapGrowth = d.HeapGrowth
	}
	if c.HeapSlack == 0 {
		c.HeapSlack = d.HeapSlack
	}
	fill(&c.QuiesceTimeout, d.QuiesceTimeout)
	fill(&c.CheckEvery, d.CheckEvery)
	fill(&c.ProgressEvery, d.ProgressEvery)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.HCA != HCASoft && c.HCA != HCARoCEv2:
		return c, fmt.Errorf("%w: HCA %q (%s or %s)", ErrConfig, c.HCA, HCASoft, HCARoCEv2)
	case c.Hosts < 2 || c.Hosts > MaxHosts:
		return c, fmt.Errorf("%w: %d hosts (2..%d)", ErrConfig, c.Hosts, MaxHosts)
	case c.HCA == HCARoCEv2 && c.Hosts > rocev2.MaxLoopbackDevices:
		return c, fmt.Errorf("%w: %d hosts on %s (2..%d)", ErrConfig, c.Hosts, c.HCA, rocev2.MaxLoopbackDevices)
	case c.MaxPacket < soakMinIP || c.MaxPacket > 65520:
		return c, fmt.Errorf("%w: max packet %d (%d..65520)", ErrConfig, c.MaxPacket, soakMinIP)
	case c.RepeatPeer < 0 || c.RepeatPeer > 1 || c.ReARP < 0 || c.ReARP > 1:
		return c, fmt.Errorf("%w: probabilities must be in [0,1]", ErrConfig)
	case c.SendQueueSize < 4 || c.RecvQueueSize < 4:
		return c, fmt.Errorf("%w: queue sizes %d/%d below 4", ErrConfig, c.SendQueueSize, c.RecvQueueSize)
	}
	return c, nil
}
