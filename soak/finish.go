package soak

import (
	"fmt"
	"runtime"
	"time"
)

// finish runs the end-of-soak checks, with the generators stopped:
//
//  1. traffic drains (host queues empty, no TX credit held, no completion
//     held by the fabric, counters still);
//  2. every SRQ buffer is posted again;
//  3. idle connections are reaped on both sides and their CM ids leave
//     time-wait, leaving each host with its UD QP and GSI QP only;
//  4. after Close of every interface the fabric holds no QP, CQ, SRQ, AH
//     or multicast attachment; after the fabric's Close no goroutine is
//     left;
//  5. every packet the engines read was delivered or counted under a
//     named drop reason.
func (s *soakRun) finish() *Report {
	elapsed := time.Since(s.start)
	cfg := &s.cfg

	var last [4]uint64
	drained := s.waitFor(func() (bool, string) {
		queued := 0
		for _, h := range s.hosts {
			queued += h.queued()
		}
		t := s.totals()
		v := s.hca.view()
		_, recv := s.flows.totals()
		now := [4]uint64{t.RxPackets, t.DropTotal, t.DeadDropped, recv}
		still := now == last
		last = now
		return queued == 0 && t.Outstanding == 0 && v.Held == 0 && still,
			fmt.Sprintf("%d frames queued, %d TX credits held, %d completions or datagrams held", queued, t.Outstanding, v.Held)
	})
	if !drained.ok {
		s.viol.record(violQuiesce, "traffic did not drain: "+drained.state)
	}
	t := s.check()
	if drained.ok && t.SRQShort > 0 {
		s.viol.record(violSRQ, "at quiescence: "+t.firstSRQDetail)
	}

	want := 2 * cfg.Hosts // each host's UD QP and the CM's GSI QP
	idle := s.waitFor(func() (bool, string) {
		t := s.totals()
		v := s.hca.view()
		return t.LiveConns == 0 && t.CMLive == 0 && v.QPs == want,
			fmt.Sprintf("%d RX and %d TX connections, %d CM ids, %d QPs (want %d)", t.RXConns, t.TXConns, t.CMLive, v.QPs, want)
	})
	if !idle.ok {
		s.viol.record(violLeak, "idle connections not reaped: "+idle.state)
	}
	before := s.totals()

	s.closeIfaces()
	for _, w := range s.watches {
		w.settle(nil) // the pollers are stopped: their last batches are handled
	}
	fs := s.hca.view()
	if left := fs.QPs + fs.CQs + fs.SRQs + fs.AHs + fs.McastAttachments + fs.Held; left > 0 {
		s.viol.record(violLeak, fmt.Sprintf("after Close: %d QPs, %d CQs, %d SRQs, %d AHs, %d multicast attachments, %d completions or datagrams held",
			fs.QPs, fs.CQs, fs.SRQs, fs.AHs, fs.McastAttachments, fs.Held))
	}
	after := s.totals()
	s.observeFabric(fs, after)

	sent, received := s.flows.totals()
	dataDrops := after.DropTotal
	for name := range nonDataDrops {
		dataDrops -= after.Drops[name]
	}
	explained := dataDrops + after.DeadDropped + fs.UDDrops
	var lost uint64
	if sent > received {
		lost = sent - received
	}
	if lost > explained {
		s.viol.record(violLost, fmt.Sprintf("%d packets lost, %d drops counted (engine %d, dead %d, fabric UD %d)",
			lost, explained, dataDrops, after.DeadDropped, fs.UDDrops))
	}
	if received == 0 || after.Reaper.TXEstablished == 0 {
		s.viol.record(violNoTraffic, fmt.Sprintf("%d packets sent, %d received, %d connections established",
			sent, received, after.Reaper.TXEstablished))
	}

	s.hca.close()
	final := s.hca.view()
	if final.Goroutines != 0 {
		s.viol.record(violLeak, fmt.Sprintf("%d fabric goroutines after Close", final.Goroutines))
	}
	if n := openSockets(); n > s.sockets {
		s.viol.record(violLeak, fmt.Sprintf("%d sockets open after Close, %d at start", n, s.sockets))
	}
	gor := s.waitFor(func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= s.goroutines, fmt.Sprintf("%d goroutines, %d at start", n, s.goroutines)
	})
	if !gor.ok {
		s.viol.record(violLeak, gor.state)
	}
	return s.report(elapsed, before, after, final, sent, received, lost, explained)
}

// nonDataDrops are the engine's drop reasons that can never hold a soak
// packet (ARP, ND, our own broadcasts); they do not explain a loss.
var nonDataDrops = map[string]bool{
	"rx_own_echo": true, "tx_bad_arp": true, "rx_bad_arp": true, "tx_bad_nd": true, "rx_bad_nd": true,
}

// observeFabric applies the counter invariants (the dead-flag one is
// recorded by the verbs watches as it happens).
func (s *soakRun) observeFabric(fs backendView, t soakTotals) {
	s.viol.observe(violAfterReap, fs.CompletionsAfterDestroy,
		fmt.Sprintf("%d completions polled for QPs already destroyed", fs.CompletionsAfterDestroy))
	s.viol.observe(violDestroyedQPOp, fs.DestroyedQPOps, fmt.Sprintf("%d verbs on destroyed QPs", fs.DestroyedQPOps))
	s.viol.observe(violCQOverflow, fs.CQOverflows+t.CQErrors, fmt.Sprintf("%d CQ overflows, %d CQ_ERR events", fs.CQOverflows, t.CQErrors))
}

// closeIfaces closes every interface in parallel (each waits for its own
// drain).
func (s *soakRun) closeIfaces() {
	done := make(chan struct{}, len(s.ifcs))
	for _, ifc := range s.ifcs {
		go func() {
			ifc.Close()
			done <- struct{}{}
		}()
	}
	for range s.ifcs {
		<-done
	}
}

// waitResult is the outcome of waitFor: whether the condition held, and
// the last state it described.
type waitResult struct {
	ok    bool
	state string
}

// waitFor polls cond until it holds or QuiesceTimeout passes. The soak
// watches a distributed system from outside; its counters are the only
// thing to wait on.
func (s *soakRun) waitFor(cond func() (bool, string)) waitResult {
	deadline := time.NewTimer(s.cfg.QuiesceTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return waitResult{true, state}
		}
		select {
		case <-deadline.C:
			return waitResult{false, state}
		case <-tick.C:
		}
	}
}
