package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// InvariantResult is one invariant's outcome.
type InvariantResult struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Violations  uint64 `json:"violations"`
	First       string `json:"first,omitempty"` // detail of the first violation
}

// Traffic is the packet accounting: every packet the engines read
// from a host was delivered to its destination host or dropped under a
// named reason.
type Traffic struct {
	Sent      uint64            `json:"sent"`
	Received  uint64            `json:"received"`
	Lost      uint64            `json:"lost"`
	Explained uint64            `json:"drops_counted"`
	Drops     map[string]uint64 `json:"drops_by_reason"`
	DeadDrops uint64            `json:"rx_dead_dropped"`
	FabricUD  uint64            `json:"fabric_ud_drops"`
	ARPAsked  uint64            `json:"arp_requests_answered"`
	ARPLearnt uint64            `json:"arp_replies_learned"`
	ICMP      uint64            `json:"icmp_from_engine"`
}

// Fabric is the HCA backend's view (counters a backend does not have
// stay zero; the transport and UDP ones are the RoCEv2 backend's).
type Fabric struct {
	RCMessages              uint64 `json:"rc_messages"`
	UDMessages              uint64 `json:"ud_messages"`
	RNRNaks                 uint64 `json:"rnr_naks"`
	DelayedCompletions      uint64 `json:"delayed_completions"`
	CompletionsAfterDestroy uint64 `json:"completions_after_destroy"`
	DestroyedQPOps          uint64 `json:"destroyed_qp_ops"`
	CQOverflows             uint64 `json:"cq_overflows"`
	LastWQEReached          uint64 `json:"last_wqe_reached"`
	PurgedCompletions       uint64 `json:"purged_completions"`
	SpuriousEvents          uint64 `json:"spurious_events"`
	// Retransmits counts RC packets sent again; Timeouts transport timer
	// expiries; SeqNAKs sequence NAKs sent; Duplicates RC request packets
	// received twice.
	Retransmits uint64 `json:"retransmits"`
	Timeouts    uint64 `json:"timeouts"`
	SeqNAKs     uint64 `json:"seq_naks"`
	Duplicates  uint64 `json:"duplicates"`
	// UDP* count the datagrams the RoCEv2 fault injection dropped,
	// duplicated, reordered and delayed.
	UDPDropped    uint64 `json:"udp_dropped"`
	UDPDuplicated uint64 `json:"udp_duplicated"`
	UDPReordered  uint64 `json:"udp_reordered"`
	UDPDelayed    uint64 `json:"udp_delayed"`
}

// Heap is the heap bound.
type Heap struct {
	StartBytes uint64 `json:"start_bytes"`
	PeakBytes  uint64 `json:"peak_bytes"`
	LimitBytes uint64 `json:"limit_bytes"`
}

// Settings echoes what the soak ran with.
type Settings struct {
	// HCA is the backend the soak ran on: "soft" or "rocev2".
	HCA              string `json:"hca"`
	Hosts            int    `json:"hosts"`
	Duration         string `json:"duration"`
	Seed             int64  `json:"seed"`
	StaleAfter       string `json:"stale_after"`
	StaleScan        string `json:"stale_scan"`
	NeighbourTimeout string `json:"neighbour_timeout"`
	// Faults are the soft fabric's (soft only); RoCEv2 the RoCEv2
	// backend's settings (rocev2 only).
	Faults             *soft.Faults `json:"faults,omitempty"`
	RoCEv2             *RoCEv2      `json:"rocev2,omitempty"`
	UnsafeSkipDeadFlag bool         `json:"unsafe_skip_dead_flag"`
	UnsafeSkipDrain    bool         `json:"unsafe_skip_drain"`
}

// Report is the outcome of Run.
type Report struct {
	Settings   Settings          `json:"settings"`
	Elapsed    time.Duration     `json:"elapsed_ns"`
	Traffic    Traffic           `json:"traffic"`
	Engine     Engine            `json:"engine"`
	Fabric     Fabric            `json:"fabric"`
	Heap       Heap              `json:"heap"`
	Invariants []InvariantResult `json:"invariants"`
	Violations uint64            `json:"violations"`
	// Interrupted, if set, says why the traffic stopped before
	// Settings.Duration: the cause of Run's context (under ipoib soak, the
	// signal). Elapsed is how long it ran; the end checks ran as always.
	Interrupted string `json:"interrupted,omitempty"`
	// Timeline samples the run (about every second, finer for short
	// soaks) for --plot.
	Timeline []Sample `json:"timeline"`
	// CaptureFile is where --capture wrote its ring (an invariant broke).
	CaptureFile  string `json:"capture_file,omitempty"`
	CaptureBytes int64  `json:"capture_bytes,omitempty"`
}

// Engine sums the interfaces' reaper and connection counters.
type Engine struct {
	TXConnects        uint64 `json:"tx_connects"`
	TXEstablished     uint64 `json:"tx_established"`
	TXConnectFailures uint64 `json:"tx_connect_failures"`
	TXTeardowns       uint64 `json:"tx_teardowns"`
	RXAccepted        uint64 `json:"rx_accepted"`
	StaleScans        uint64 `json:"stale_scans"`
	StaleReaped       uint64 `json:"stale_reaped"`
	MovedToError      uint64 `json:"moved_to_error"`
	LastWQESeen       uint64 `json:"last_wqe_seen"`
	DrainsPosted      uint64 `json:"drains_posted"`
	DrainsCompleted   uint64 `json:"drains_completed"`
	Reaped            uint64 `json:"reaped"`
	ForcedAtStop      uint64 `json:"forced_at_stop"`
	NeighAged         uint64 `json:"neigh_aged"`
	TXQueueStops      uint64 `json:"tx_queue_stops"`
	// DeliveredAfterTeardown counts receive completions of QPs in
	// teardown that reached the host (must be 0).
	DeliveredAfterTeardown uint64 `json:"delivered_after_teardown"`
	// DeadVerified counts receive completions of QPs in teardown that the
	// verbs watch saw recycled (the dead-flag invariant exercised).
	DeadVerified uint64 `json:"dead_completions_verified"`
}

// backend names the HCA the soak ran on, with its address family.
func (s *Settings) backend() string {
	switch {
	case s.RoCEv2 != nil && s.RoCEv2.IPv6:
		return s.HCA + " (IPv6 loopback)"
	case s.RoCEv2 != nil:
		return s.HCA + " (IPv4 loopback)"
	}
	return s.HCA
}

// Failed reports whether any invariant was violated.
func (r *Report) Failed() bool { return r.Violations > 0 }

// Verdict is the report's last word: INTERRUPTED for a run cut short
// (whatever it saw: a shorter run proves less), else FAIL on any
// violation, else PASS.
func (r *Report) Verdict() string {
	switch {
	case r.Interrupted != "":
		return "INTERRUPTED"
	case r.Failed():
		return "FAIL"
	}
	return "PASS"
}

func (s *soakRun) report(elapsed time.Duration, before, after soakTotals, fs backendView, sent, received, lost, explained uint64) *Report {
	cfg := &s.cfg
	r := &Report{
		Settings: Settings{
			HCA: cfg.HCA, Hosts: cfg.Hosts, Duration: cfg.Duration.String(), Seed: cfg.Seed,
			StaleAfter: cfg.StaleAfter.String(), StaleScan: cfg.StaleScan.String(),
			NeighbourTimeout:   cfg.NeighbourTimeout.String(),
			UnsafeSkipDeadFlag: cfg.Mutations.SkipDeadFlag, UnsafeSkipDrain: cfg.Mutations.SkipDrain,
		},
		Elapsed: elapsed,
		Traffic: Traffic{
			Sent: sent, Received: received, Lost: lost, Explained: explained,
			Drops: after.Drops, DeadDrops: after.DeadDropped, FabricUD: fs.UDDrops,
		},
		Fabric: Fabric{
			RCMessages: fs.RCMessages, UDMessages: fs.UDMessages, RNRNaks: fs.RNRNaks,
			DelayedCompletions: fs.DelayedCompletions, CompletionsAfterDestroy: fs.CompletionsAfterDestroy,
			DestroyedQPOps: fs.DestroyedQPOps, CQOverflows: fs.CQOverflows, LastWQEReached: fs.LastWQEReached,
			PurgedCompletions: fs.PurgedCompletions, SpuriousEvents: fs.SpuriousEvents,
			Retransmits: fs.Retransmits, Timeouts: fs.Timeouts, SeqNAKs: fs.SeqNAKs, Duplicates: fs.Duplicate,
			UDPDropped: fs.UDPDropped, UDPDuplicated: fs.UDPDuplicated, UDPReordered: fs.UDPReordered, UDPDelayed: fs.UDPDelayed,
		},
		Heap:       Heap{StartBytes: s.heapStart, PeakBytes: s.heapPeak, LimitBytes: s.heapLimit},
		Invariants: s.viol.results(),
		Violations: s.viol.total(),
	}
	switch cfg.HCA {
	case HCARoCEv2:
		r.Settings.RoCEv2 = &cfg.RoCEv2
	default:
		r.Settings.Faults = &cfg.Faults
	}
	for _, h := range s.hosts {
		r.Traffic.ARPAsked += h.ctr.arpRequestsAnswered.Load()
		r.Traffic.ARPLearnt += h.ctr.arpRepliesLearned.Load()
		r.Traffic.ICMP += h.ctr.icmp.Load()
	}
	e := &after.Reaper
	r.Engine = Engine{
		TXConnects: e.TXConnects, TXEstablished: e.TXEstablished, TXConnectFailures: e.TXConnectFailures,
		TXTeardowns: e.TXTeardowns, RXAccepted: e.RXAccepted, StaleScans: e.StaleScans,
		StaleReaped: e.StaleReaped, MovedToError: e.MovedToError, LastWQESeen: e.LastWQESeen,
		DrainsPosted: e.DrainsPosted, DrainsCompleted: e.DrainsCompleted, Reaped: e.Reaped,
		ForcedAtStop: e.ForcedAtStop, NeighAged: e.NeighAged, TXQueueStops: e.TXQueueStops,
		DeliveredAfterTeardown: after.DeliveredDead,
	}
	for _, w := range s.watches {
		r.Engine.DeadVerified += w.checked.Load()
	}
	return r
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("soak report: %w", err)
	}
	return nil
}

// WriteTable writes the human-readable summary: activity, packet
// accounting and one line per invariant.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	s := &r.Settings
	fmt.Fprintf(tw, "soak\t%d hosts on %s, %s (ran %s), seed %d, stale after %s\n", s.Hosts, s.backend(), s.Duration, r.Elapsed.Round(time.Millisecond), s.Seed, s.StaleAfter)
	if s.UnsafeSkipDeadFlag || s.UnsafeSkipDrain {
		fmt.Fprintf(tw, "mutations\tskip dead flag %v, skip drain %v\n", s.UnsafeSkipDeadFlag, s.UnsafeSkipDrain)
	}
	e := &r.Engine
	fmt.Fprintf(tw, "connections\t%d connects, %d established, %d accepted, %d failed\n", e.TXConnects, e.TXEstablished, e.RXAccepted, e.TXConnectFailures)
	fmt.Fprintf(tw, "reaping\t%d stale, %d to error, %d LAST_WQE, %d drains, %d reaped, %d forced, %d TX aged\n",
		e.StaleReaped, e.MovedToError, e.LastWQESeen, e.DrainsPosted, e.Reaped, e.ForcedAtStop, e.NeighAged)
	f := &r.Fabric
	fmt.Fprintf(tw, "dead flag\t%d completions of QPs in teardown seen recycled, %d delivered\n", e.DeadVerified, e.DeliveredAfterTeardown)
	fmt.Fprintf(tw, "fabric\t%d RC, %d UD messages, %d RNR NAKs, %d delayed completions, %d LAST_WQE, %d retransmits\n",
		f.RCMessages, f.UDMessages, f.RNRNaks, f.DelayedCompletions, f.LastWQEReached, f.Retransmits)
	if s.HCA == HCARoCEv2 {
		fmt.Fprintf(tw, "transport\t%d timeouts, %d sequence NAKs, %d duplicates received\n", f.Timeouts, f.SeqNAKs, f.Duplicates)
		fmt.Fprintf(tw, "UDP faults\t%d dropped, %d duplicated, %d reordered, %d delayed\n", f.UDPDropped, f.UDPDuplicated, f.UDPReordered, f.UDPDelayed)
	}
	t := &r.Traffic
	fmt.Fprintf(tw, "packets\t%d sent, %d received, %d lost, %d drops counted (%d dead, %d fabric UD)\n",
		t.Sent, t.Received, t.Lost, t.Explained, t.DeadDrops, t.FabricUD)
	names := make([]string, 0, len(t.Drops))
	for n, v := range t.Drops {
		if v != 0 { // the engine reports every reason; the text shows those that counted
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(tw, "  drop\t%s %d\n", n, t.Drops[n])
	}
	fmt.Fprintf(tw, "heap\tstart %d MiB, peak %d MiB, limit %d MiB\n", r.Heap.StartBytes>>20, r.Heap.PeakBytes>>20, r.Heap.LimitBytes>>20)
	if r.CaptureFile != "" {
		fmt.Fprintf(tw, "capture\t%s (%d KiB): the packets and engine events around the first violation\n", r.CaptureFile, r.CaptureBytes>>10)
	}
	fmt.Fprintf(tw, "\ninvariant\tviolations\tresult\tfirst\n")
	for _, inv := range r.Invariants {
		res := "ok"
		if inv.Violations > 0 {
			res = "VIOLATED"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", inv.Name, inv.Violations, res, inv.First)
	}
	if r.Interrupted != "" {
		fmt.Fprintf(tw, "\n%s\t%d violations in %s of %s (%s)\n", r.Verdict(), r.Violations, r.Elapsed.Round(time.Millisecond), s.Duration, r.Interrupted)
	} else {
		fmt.Fprintf(tw, "\n%s\t%d violations\n", r.Verdict(), r.Violations)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("soak report: %w", err)
	}
	return nil
}
