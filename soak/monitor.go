package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/ipoibcm/ipoib/ipoibcm"
)

// soakTotals sums the interfaces' statistics at one moment.
type soakTotals struct {
	LiveConns      int
	RXConns        int
	TXConns        int
	CMLive         int
	Established    uint64
	Reaped         uint64
	StaleReaped    uint64
	DeadDropped    uint64
	CQErrors       uint64
	DeliveredDead  uint64 // seen by the verbs watches
	Outstanding    int64
	RxPackets      uint64
	Drops          map[string]uint64
	DropTotal      uint64
	Reaper         ipoibcm.ReaperStats
	SRQShort       int // interfaces whose SRQ is not fully posted
	SRQOver        int // interfaces with more SRQ buffers posted than exist
	firstSRQDetail string
}

// totals reads every interface once.
func (s *soakRun) totals() soakTotals {
	t := soakTotals{Drops: make(map[string]uint64)}
	for k, ifc := range s.ifcs {
		st := ifc.Stats()
		t.RXConns += len(st.RXConns)
		t.TXConns += len(st.TXConns)
		t.CMLive += st.CM.LiveConns
		r := st.Reaper
		addReaper(&t.Reaper, &r)
		t.Established += r.TXEstablished
		t.Reaped += r.Reaped
		t.StaleReaped += r.StaleReaped
		t.CQErrors += r.CQErrors
		t.DeadDropped += st.Counters.RxDeadDropped
		t.Outstanding += st.Outstanding
		t.RxPackets += st.Counters.RxPackets
		for name, v := range st.Drops {
			t.Drops[name] += v
			t.DropTotal += v
		}
		switch {
		case st.SRQPosted > st.SRQSize:
			t.SRQOver++
			if t.firstSRQDetail == "" {
				t.firstSRQDetail = fmt.Sprintf("host %d: %d SRQ buffers posted of %d", k, st.SRQPosted, st.SRQSize)
			}
		case st.SRQPosted < st.SRQSize:
			t.SRQShort++
			if t.firstSRQDetail == "" {
				t.firstSRQDetail = fmt.Sprintf("host %d: %d SRQ buffers posted of %d", k, st.SRQPosted, st.SRQSize)
			}
		}
	}
	for _, w := range s.watches {
		t.DeliveredDead += w.violated.Load()
	}
	t.LiveConns = t.RXConns + t.TXConns
	return t
}

// monitor runs the continuous checks and the progress line until the
// duration is over or ctx ends.
func (s *soakRun) monitor(ctx context.Context) {
	tick := time.NewTicker(s.cfg.CheckEvery)
	defer tick.Stop()
	end := time.NewTimer(s.cfg.Duration)
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			s.endProgress()
			return
		case <-end.C:
			s.check()
			s.endProgress()
			return
		case <-tick.C:
			s.check()
		}
	}
}

// check runs the invariants that hold at every moment.
func (s *soakRun) check() soakTotals {
	t := s.totals()
	s.observeFabric(s.hca.view(), t)
	if t.SRQOver > 0 {
		s.viol.record(violSRQ, t.firstSRQDetail)
	}
	h := heapInuse()
	s.heapPeak = max(s.heapPeak, h)
	if h > s.heapLimit {
		s.viol.record(violHeap, fmt.Sprintf("heap in use %d MiB above limit %d MiB (start %d MiB)", h>>20, s.heapLimit>>20, s.heapStart>>20))
	}
	s.progress(t)
	s.observe.sample(time.Since(s.start), t, s.viol.total(), false)
	return t
}

// progress prints the live line: rewritten in place on a terminal, every
// ProgressEvery otherwise.
func (s *soakRun) progress(t soakTotals) {
	w := s.cfg.Progress
	if w == nil {
		return
	}
	now := time.Now()
	if !s.cfg.ProgressTTY && now.Sub(s.lastPrint) < s.cfg.ProgressEvery {
		return
	}
	s.lastPrint = now
	line := fmt.Sprintf("soak %6.1fs  live %5d  established %7d  reaped %7d  dead-dropped %6d  violations %d",
		now.Sub(s.start).Seconds(), t.LiveConns, t.Established, t.Reaped, t.DeadDropped, s.viol.total())
	if s.cfg.ProgressTTY {
		fmt.Fprintf(w, "\r%s\x1b[K", line)
		return
	}
	fmt.Fprintln(w, line)
}

// endProgress ends a rewritten line so what follows starts on its own.
func (s *soakRun) endProgress() {
	if s.cfg.Progress != nil && s.cfg.ProgressTTY {
		fmt.Fprintln(s.cfg.Progress)
	}
}

func addReaper(into, r *ipoibcm.ReaperStats) {
	into.StaleScans += r.StaleScans
	into.StaleReaped += r.StaleReaped
	into.MovedToError += r.MovedToError
	into.LastWQESeen += r.LastWQESeen
	into.LateLastWQE += r.LateLastWQE
	into.DrainsPosted += r.DrainsPosted
	into.DrainsCompleted += r.DrainsCompleted
	into.DrainPostFailures += r.DrainPostFailures
	into.Reaped += r.Reaped
	into.ForcedAtStop += r.ForcedAtStop
	into.CQErrors += r.CQErrors
	into.RXAccepted += r.RXAccepted
	into.RXRejectedNoQP += r.RXRejectedNoQP
	into.TXConnects += r.TXConnects
	into.TXEstablished += r.TXEstablished
	into.TXConnectFailures += r.TXConnectFailures
	into.TXTeardowns += r.TXTeardowns
	into.TXDestroyed += r.TXDestroyed
	into.TXQueueStops += r.TXQueueStops
	into.TXQueueWakes += r.TXQueueWakes
	into.NeighRestarts += r.NeighRestarts
	into.NeighAged += r.NeighAged
}
