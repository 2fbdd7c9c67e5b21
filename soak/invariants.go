package soak

import (
	"sync"
	"sync/atomic"
)

// violKind names one invariant of the soak. Each is
// checked continuously where it can be, and again at quiescence.
//
//go:generate go tool stringer -type=violKind -linecomment
type violKind int

const (
	// violDeadDelivered: a receive completion of a connection whose
	// teardown had begun reached the host (the dead flag's job).
	violDeadDelivered violKind = iota // dead_completion_delivered
	// violAfterReap: a completion was polled for a QP already destroyed
	// (the drain's job: nothing of a reaped connection is left in the CQ).
	violAfterReap // completion_after_reap
	// violDestroyedQPOp: a verb was called on a destroyed QP.
	violDestroyedQPOp // destroyed_qp_op
	// violSRQ: SRQ buffers not conserved: at quiescence every buffer must
	// be posted again.
	violSRQ // srq_buffers_conserved
	// violLeak: QPs, CQs, SRQs, CM ids or goroutines left after Close.
	violLeak // leak_at_quiescence
	// violPayload: a soak packet arrived corrupted, misdelivered, or with
	// a sequence number its sender never sent.
	violPayload // payload_intact
	// violOrder: a flow's sequence numbers went backwards or repeated.
	violOrder // in_order_per_flow
	// violBadFrame: the engine handed the host a frame it cannot explain.
	violBadFrame // frames_explained
	// violLost: packets missing that no named drop reason accounts for.
	violLost // losses_explained
	// violCQOverflow: a CQ overflowed (CQ_ERR).
	violCQOverflow // cq_overflow
	// violHeap: the heap grew past its limit.
	violHeap // heap_bounded
	// violQuiesce: traffic did not drain within the quiescence timeout
	// (something is wedged).
	violQuiesce // quiescence_reached
	// violNoTraffic: the soak delivered nothing, or established no
	// connection: a run that exercised nothing proves nothing (ud-loss 1
	// once reported "PASS 0 violations" after 0 connects).
	violNoTraffic // traffic_carried
	numViolKinds
)

var violDescriptions = [numViolKinds]string{
	violDeadDelivered: "no completion delivered for a connection in teardown",
	violAfterReap:     "no completion polled for a destroyed QP",
	violDestroyedQPOp: "no verb called on a destroyed QP",
	violSRQ:           "SRQ posted = size at quiescence (posted + in flight conserved)",
	violLeak:          "QPs, CQs, SRQs, CM ids, goroutines back to zero/baseline after Close",
	violPayload:       "payload checksums, lengths and addressing intact",
	violOrder:         "sequence numbers increase per sender->receiver flow",
	violBadFrame:      "every frame to the host is one it can explain",
	violLost:          "sent = received + dropped under a named reason",
	violCQOverflow:    "no CQ overflow / CQ_ERR",
	violHeap:          "heap in use below its limit",
	violQuiesce:       "traffic drains once the senders stop",
	violNoTraffic:     "packets delivered over established connections",
}

// soakViolations collects violations from every goroutine of the soak.
type soakViolations struct {
	count [numViolKinds]atomic.Uint64
	mu    sync.Mutex
	first [numViolKinds]string
	// onFirst, if set, is told of each invariant's first violation (the
	// capture ring's trigger); set before the soak starts.
	onFirst func(name, detail string)
}

// record counts one violation of k; the first detail is kept.
func (v *soakViolations) record(k violKind, detail string) {
	v.count[k].Add(1)
	v.keepFirst(k, detail)
}

// observe raises k's count to n (for invariants read from counters that
// only grow).
func (v *soakViolations) observe(k violKind, n uint64, detail string) {
	for {
		old := v.count[k].Load()
		if n <= old {
			return
		}
		if v.count[k].CompareAndSwap(old, n) {
			v.keepFirst(k, detail)
			return
		}
	}
}

func (v *soakViolations) keepFirst(k violKind, detail string) {
	v.mu.Lock()
	first := v.first[k] == ""
	if first {
		v.first[k] = detail
	}
	v.mu.Unlock()
	if first && v.onFirst != nil {
		v.onFirst(k.String(), detail)
	}
}

// total is the number of violations of every kind.
func (v *soakViolations) total() uint64 {
	var t uint64
	for k := range numViolKinds {
		t += v.count[k].Load()
	}
	return t
}

// results lists every invariant with its count and first detail.
func (v *soakViolations) results() []InvariantResult {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]InvariantResult, 0, numViolKinds)
	for k := range numViolKinds {
		out = append(out, InvariantResult{
			Name:        k.String(),
			Description: violDescriptions[k],
			Violations:  v.count[k].Load(),
			First:       v.first[k],
		})
	}
	return out
}

// soakFlows counts, per sender->receiver flow, the packets the engine read
// from the sender's host and those that reached the receiver's host.
type soakFlows struct {
	hosts int
	sentN []atomic.Uint64 // [src*hosts+dst]
	recvN []atomic.Uint64
}

func newSoakFlows(hosts int) *soakFlows {
	return &soakFlows{hosts: hosts, sentN: make([]atomic.Uint64, hosts*hosts), recvN: make([]atomic.Uint64, hosts*hosts)}
}

func (f *soakFlows) sent(src, dst int) { f.sentN[src*f.hosts+dst].Add(1) }

// received counts one packet of flow src->dst and reports whether its
// sequence number is one the sender's host has already handed over.
// Sequence numbers start at 1 and are read in order, so seq n exists once
// n packets of the flow were read.
func (f *soakFlows) received(src, dst int, seq uint64) bool {
	k := src*f.hosts + dst
	f.recvN[k].Add(1)
	return seq <= f.sentN[k].Load()
}

// totals sums every flow.
func (f *soakFlows) totals() (sent, received uint64) {
	for k := range f.sentN {
		sent += f.sentN[k].Load()
		received += f.recvN[k].Load()
	}
	return sent, received
}
