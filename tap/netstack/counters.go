package netstack

import "sync/atomic"

// Counters is a snapshot of a Host's link counters. "rx" is toward the stack
// (frames given to WriteFrames), "tx" is from the stack (frames ReadFrames
// hands out), as the kernel counts them on a TAP's host side.
type Counters struct {
	RxPackets uint64 // frames delivered to the stack
	RxBytes   uint64
	TxPackets uint64 // frames handed out by ReadFrames
	TxBytes   uint64

	RxDroppedOtherHost uint64 // unicast to a MAC that is not ours
	RxDroppedRunt      uint64 // shorter than an Ethernet header
	RxDroppedEtherType uint64 // neither IPv4, IPv6 nor ARP
	RxDroppedLinkDown  uint64 // arrived while carrier was down
	RxDroppedClosed    uint64 // arrived after Close
	// RxDroppedStalePMTU counts ICMP frag-needed / packet-too-big
	// messages about packets sent before the link MTU went down (they
	// report an MTU no smaller than the link's); see isStalePMTU.
	RxDroppedStalePMTU uint64
	// RxDroppedOversize counts frames longer than an Ethernet header and
	// the largest IP packet (65535 bytes).
	RxDroppedOversize  uint64
	TxDroppedQueueFull uint64 // the frame queue toward the engine was full
	TxDroppedLinkDown  uint64 // sent while carrier was down
	TxDroppedClosed    uint64 // sent after Close
	TxTruncated        uint64 // longer than the caller's ReadFrames buffer
	// TxResegmented counts TCP segments the link cut to the MTU on their
	// way out because the reader does not take them whole: host GSO super
	// frames for a reader without TSO, and segments queued while the MTU
	// was larger (each cut is a TxPacket).
	TxResegmented uint64
	// TxSuperFrames counts GSO super frames handed to a reader that takes
	// them whole (ReadFramesMeta with TSO); each is one TxPacket.
	TxSuperFrames uint64
	// RxSuperFrames counts TCP super frames (GSO metadata) delivered to
	// the stack whole; each is one RxPacket.
	RxSuperFrames uint64
	// RxResegmented counts UDP super frames cut into their datagrams
	// before the stack (each datagram is an RxPacket).
	RxResegmented uint64
	// RxDroppedOffload counts frames whose offload metadata contradicts
	// the frame (see WriteFramesMeta).
	RxDroppedOffload uint64
	// RxCsumVouched counts frames delivered without the stack verifying
	// their TCP/UDP checksum because the writer vouched for it: a partial
	// checksum (never computed, as veth passes CHECKSUM_PARTIAL) or
	// DataValid (verified by the HCA). See WriteFramesMeta.
	RxCsumVouched uint64
	// RxGathered counts frames WriteFramesGather received in more than
	// one piece and copied into one gVisor chunk.
	RxGathered uint64
}

// RxDropped sums the receive drop reasons.
func (c Counters) RxDropped() uint64 {
	return c.RxDroppedOtherHost + c.RxDroppedRunt + c.RxDroppedEtherType + c.RxDroppedLinkDown + c.RxDroppedClosed + c.RxDroppedStalePMTU + c.RxDroppedOversize + c.RxDroppedOffload
}

// TxDropped sums the transmit drop reasons.
func (c Counters) TxDropped() uint64 {
	return c.TxDroppedQueueFull + c.TxDroppedLinkDown + c.TxDroppedClosed
}

// counters is the live, concurrently updated form of Counters.
type counters struct {
	rxPackets, rxBytes, txPackets, txBytes atomic.Uint64

	rxDroppedOtherHost, rxDroppedRunt, rxDroppedEtherType  atomic.Uint64
	rxDroppedLinkDown, rxDroppedClosed, rxDroppedStalePMTU atomic.Uint64
	rxDroppedOversize                                      atomic.Uint64
	txDroppedQueueFull, txDroppedLinkDown, txDroppedClosed atomic.Uint64
	txTruncated, txResegmented, txSuperFrames              atomic.Uint64
	rxSuperFrames, rxResegmented, rxDroppedOffload         atomic.Uint64
	rxCsumVouched, rxGathered                              atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		RxPackets:          c.rxPackets.Load(),
		RxBytes:            c.rxBytes.Load(),
		TxPackets:          c.txPackets.Load(),
		TxBytes:            c.txBytes.Load(),
		RxDroppedOtherHost: c.rxDroppedOtherHost.Load(),
		RxDroppedRunt:      c.rxDroppedRunt.Load(),
		RxDroppedEtherType: c.rxDroppedEtherType.Load(),
		RxDroppedLinkDown:  c.rxDroppedLinkDown.Load(),
		RxDroppedClosed:    c.rxDroppedClosed.Load(),
		RxDroppedStalePMTU: c.rxDroppedStalePMTU.Load(),
		RxDroppedOversize:  c.rxDroppedOversize.Load(),
		TxDroppedQueueFull: c.txDroppedQueueFull.Load(),
		TxDroppedLinkDown:  c.txDroppedLinkDown.Load(),
		TxDroppedClosed:    c.txDroppedClosed.Load(),
		TxTruncated:        c.txTruncated.Load(),
		TxResegmented:      c.txResegmented.Load(),
		TxSuperFrames:      c.txSuperFrames.Load(),
		RxSuperFrames:      c.rxSuperFrames.Load(),
		RxResegmented:      c.rxResegmented.Load(),
		RxDroppedOffload:   c.rxDroppedOffload.Load(),
		RxCsumVouched:      c.rxCsumVouched.Load(),
		RxGathered:         c.rxGathered.Load(),
	}
}
