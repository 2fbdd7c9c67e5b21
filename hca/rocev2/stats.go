package rocev2

import (
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Stats are a device's counters, named like the kernel's where one exists.
type Stats struct {
	RxPackets uint64
	RxBytes   uint64
	TxPackets uint64
	TxBytes   uint64
	// TxErrors counts datagrams the socket refused.
	TxErrors uint64
	// Drops counts received datagrams dropped, per reason.
	Drops [wire.NumDropReasons]uint64

	Retransmits     uint64 // packets sent again (go-back-N)
	Timeouts        uint64 // transport timer expiries with work outstanding
	AcksSent        uint64
	SeqNAKsSent     uint64
	SeqNAKsReceived uint64
	RNRNAKsSent     uint64
	RNRNAKsReceived uint64
	Duplicates      uint64 // RC request packets received twice
	CQOverflows     uint64

	FaultDropped    uint64
	FaultDuplicated uint64
	FaultReordered  uint64
}

// Dropped returns the drop counter of reason r.
func (s Stats) Dropped(r wire.DropReason) uint64 {
	if r >= wire.NumDropReasons {
		return 0
	}
	return s.Drops[r]
}

// TotalDropped sums all drop counters.
func (s Stats) TotalDropped() uint64 {
	var n uint64
	for _, v := range s.Drops {
		n += v
	}
	return n
}

// counters are the live, atomically updated form of Stats.
type counters struct {
	rxPackets, rxBytes, txPackets, txBytes, txErrors atomic.Uint64
	drops                                            [wire.NumDropReasons]atomic.Uint64
	retransmits, timeouts, acksSent                  atomic.Uint64
	seqNAKsSent, seqNAKsReceived                     atomic.Uint64
	rnrNAKsSent, rnrNAKsReceived                     atomic.Uint64
	duplicates, cqOverflows                          atomic.Uint64
	faultDropped, faultDuplicated, faultReordered    atomic.Uint64
}

func (c *counters) drop(r wire.DropReason) { c.drops[r].Add(1) }

func (c *counters) snapshot() Stats {
	s := Stats{
		RxPackets: c.rxPackets.Load(), RxBytes: c.rxBytes.Load(),
		TxPackets: c.txPackets.Load(), TxBytes: c.txBytes.Load(), TxErrors: c.txErrors.Load(),
		Retransmits: c.retransmits.Load(), Timeouts: c.timeouts.Load(), AcksSent: c.acksSent.Load(),
		SeqNAKsSent: c.seqNAKsSent.Load(), SeqNAKsReceived: c.seqNAKsReceived.Load(),
		RNRNAKsSent: c.rnrNAKsSent.Load(), RNRNAKsReceived: c.rnrNAKsReceived.Load(),
		Duplicates: c.duplicates.Load(), CQOverflows: c.cqOverflows.Load(),
		FaultDropped: c.faultDropped.Load(), FaultDuplicated: c.faultDuplicated.Load(),
		FaultReordered: c.faultReordered.Load(),
	}
	for i := range c.drops {
		s.Drops[i] = c.drops[i].Load()
	}
	return s
}
