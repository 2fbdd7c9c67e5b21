package rocev2

import (
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Stats are a device's counters, named like the kernel's where one exists
// (the JSON names are what 'ipoib show' prints).
type Stats struct {
	RxPackets uint64 `json:"rx_packets"`
	RxBytes   uint64 `json:"rx_bytes"`
	TxPackets uint64 `json:"tx_packets"`
	TxBytes   uint64 `json:"tx_bytes"`
	// TxErrors counts datagrams the socket refused; TxTooBig those of
	// them refused as larger than the route toward the peer carries
	// (EMSGSIZE: the underlay MTU is below --ib-mtu plus the headers).
	TxErrors uint64 `json:"tx_errors"`
	TxTooBig uint64 `json:"tx_too_big"`
	// TxBatches and RxBatches count sendmmsg and recvmmsg calls that
	// moved datagrams: the data path's syscalls.
	TxBatches uint64 `json:"tx_batches"`
	RxBatches uint64 `json:"rx_batches"`
	// TxGSOMessages counts messages that carried several datagrams
	// (UDP_SEGMENT); RxGROMessages counts received buffers the kernel
	// coalesced from several datagrams (UDP_GRO).
	TxGSOMessages uint64 `json:"tx_gso_messages"`
	RxGROMessages uint64 `json:"rx_gro_messages"`
	// TxZeroCopy counts datagrams whose payload went to the socket from
	// the work request's buffer, not copied (RC packets and UD LSO
	// segments of 1 KiB and more, while no capture is attached).
	TxZeroCopy uint64 `json:"tx_zero_copy"`
	// Drops counts received datagrams dropped, per reason; JSON gives it
	// as an object keyed by reason name, zero counts included so a
	// script can rely on every key.
	Drops [wire.NumDropReasons]uint64 `json:"-"`

	// RCMessages and UDMessages count messages delivered into a receive
	// buffer.
	RCMessages uint64 `json:"rc_messages"`
	UDMessages uint64 `json:"ud_messages"`

	Retransmits     uint64 `json:"retransmits"` // packets sent again (go-back-N)
	Timeouts        uint64 `json:"timeouts"`    // transport timer expiries with work outstanding
	AcksSent        uint64 `json:"acks_sent"`
	SeqNAKsSent     uint64 `json:"seq_naks_sent"`
	SeqNAKsReceived uint64 `json:"seq_naks_received"`
	RNRNAKsSent     uint64 `json:"rnr_naks_sent"`
	RNRNAKsReceived uint64 `json:"rnr_naks_received"`
	Duplicates      uint64 `json:"duplicates"` // RC request packets received twice
	CQOverflows     uint64 `json:"cq_overflows"`
	// MemberRefused counts hosts heard from that were not added to the
	// broadcast group because it had Config.MaxMembers members.
	MemberRefused uint64 `json:"member_refused"`
	// McastJoins and McastLeaves count IP multicast groups joined and
	// left through the kernel (Config.Multicast); McastDelivered counts
	// copies of group datagrams delivered to attached QPs (one datagram,
	// one copy per attached QP). A group datagram no attached QP took is
	// dropped as not_attached.
	McastJoins     uint64 `json:"mcast_joins"`
	McastLeaves    uint64 `json:"mcast_leaves"`
	McastDelivered uint64 `json:"mcast_delivered"`
	// Gossip (Config.Gossip): GossipRequests counts member-list Gets
	// sent, GossipReplies the GetResps that answered Gets received (one
	// each), GossipLearned members learned from lists, GossipDropped
	// membership MADs dropped (malformed, unsolicited or stale answers,
	// and Gets not queued because the queue was full).
	GossipRequests uint64 `json:"gossip_requests"`
	GossipReplies  uint64 `json:"gossip_replies"`
	GossipLearned  uint64 `json:"gossip_learned"`
	GossipDropped  uint64 `json:"gossip_dropped"`
	// SocketDrops is the kernel's count of datagrams dropped because the
	// socket's receive buffer was full (SO_MEMINFO's sk_drops): lost
	// before the device could see or count them.
	SocketDrops uint64 `json:"socket_drops"`

	// CompletionsAfterDestroy counts completions Poll returned after
	// their QP had been destroyed; DestroyedQPOps verbs called on a
	// destroyed QP (each returned an error wrapping hca.ErrDestroyed). A
	// consumer that drains before it destroys keeps both at zero.
	CompletionsAfterDestroy uint64 `json:"completions_after_destroy"`
	DestroyedQPOps          uint64 `json:"destroyed_qp_ops"`
	// CompletionsHeld counts completions Faults.HoldCompletion held back.
	CompletionsHeld uint64 `json:"completions_held"`

	// UDDropped counts UD datagrams lost: dropped by Faults.Drop on
	// transmit or by this device's receive path (also counted in Drops
	// or FaultDropped). IPoIB sends IP packets over UD when it has no
	// connection, so this is the UD share of the packets a consumer can
	// lose.
	UDDropped uint64 `json:"ud_dropped"`

	// SourcePorts is the number of per-QP source-port sockets open;
	// SourcePortFallbacks counts QPs that send from the fabric port
	// because their port could not be bound or the device has
	// maxSourcePorts already.
	SourcePorts         uint64 `json:"source_ports"`
	SourcePortFallbacks uint64 `json:"source_port_fallbacks"`

	FaultDropped    uint64 `json:"fault_dropped"`
	FaultDuplicated uint64 `json:"fault_duplicated"`
	FaultReordered  uint64 `json:"fault_reordered"`
	FaultDelayed    uint64 `json:"fault_delayed"`
}

// MarshalJSON writes the counters with the drops as {"reason": count}.
func (s Stats) MarshalJSON() ([]byte, error) {
	type plain Stats // without the method, so Marshal does not recurse
	drops := make(map[string]uint64, wire.NumDropReasons-1)
	for r := wire.DropReason(1); r < wire.NumDropReasons; r++ {
		drops[r.String()] = s.Drops[r]
	}
	b, err := json.Marshal(struct {
		plain
		Drops map[string]uint64 `json:"rx_drops"`
	}{plain(s), drops})
	if err != nil {
		return nil, fmt.Errorf("rocev2 stats: %w", err)
	}
	return b, nil
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
	txTooBig                                         atomic.Uint64
	txBatches, rxBatches                             atomic.Uint64
	txGSOMessages, rxGROMessages, txZeroCopy         atomic.Uint64
	drops                                            [wire.NumDropReasons]atomic.Uint64
	retransmits, timeouts, acksSent                  atomic.Uint64
	seqNAKsSent, seqNAKsReceived                     atomic.Uint64
	rnrNAKsSent, rnrNAKsReceived                     atomic.Uint64
	duplicates, cqOverflows                          atomic.Uint64
	faultDropped, faultDuplicated, faultReordered    atomic.Uint64
	faultDelayed                                     atomic.Uint64
	completionsAfterDestroy, destroyedQPOps          atomic.Uint64
	completionsHeld, udDropped                       atomic.Uint64
	rcMessages, udMessages                           atomic.Uint64
	sourcePorts, sourcePortFallbacks                 atomic.Uint64
	memberRefused, socketDrops                       atomic.Uint64
	mcastJoins, mcastLeaves, mcastDelivered          atomic.Uint64
	gossipRequests, gossipReplies                    atomic.Uint64
	gossipLearned, gossipDropped                     atomic.Uint64
}

func (c *counters) drop(r wire.DropReason) { c.drops[r].Add(1) }

// dropUD counts a dropped UD datagram under its reason and in UDDropped.
func (c *counters) dropUD(r wire.DropReason) {
	c.drops[r].Add(1)
	c.udDropped.Add(1)
}

func (c *counters) snapshot() Stats {
	s := Stats{
		RxPackets: c.rxPackets.Load(), RxBytes: c.rxBytes.Load(),
		TxPackets: c.txPackets.Load(), TxBytes: c.txBytes.Load(), TxErrors: c.txErrors.Load(), TxTooBig: c.txTooBig.Load(),
		TxBatches: c.txBatches.Load(), RxBatches: c.rxBatches.Load(),
		TxGSOMessages: c.txGSOMessages.Load(), RxGROMessages: c.rxGROMessages.Load(), TxZeroCopy: c.txZeroCopy.Load(),
		Retransmits: c.retransmits.Load(), Timeouts: c.timeouts.Load(), AcksSent: c.acksSent.Load(),
		SeqNAKsSent: c.seqNAKsSent.Load(), SeqNAKsReceived: c.seqNAKsReceived.Load(),
		RNRNAKsSent: c.rnrNAKsSent.Load(), RNRNAKsReceived: c.rnrNAKsReceived.Load(),
		Duplicates: c.duplicates.Load(), CQOverflows: c.cqOverflows.Load(),
		FaultDropped: c.faultDropped.Load(), FaultDuplicated: c.faultDuplicated.Load(),
		FaultReordered: c.faultReordered.Load(), FaultDelayed: c.faultDelayed.Load(),
		CompletionsAfterDestroy: c.completionsAfterDestroy.Load(), DestroyedQPOps: c.destroyedQPOps.Load(),
		CompletionsHeld: c.completionsHeld.Load(), UDDropped: c.udDropped.Load(),
		RCMessages: c.rcMessages.Load(), UDMessages: c.udMessages.Load(),
		SourcePorts: c.sourcePorts.Load(), SourcePortFallbacks: c.sourcePortFallbacks.Load(),
		MemberRefused: c.memberRefused.Load(),
		McastJoins:    c.mcastJoins.Load(), McastLeaves: c.mcastLeaves.Load(), McastDelivered: c.mcastDelivered.Load(),
		GossipRequests: c.gossipRequests.Load(), GossipReplies: c.gossipReplies.Load(),
		GossipLearned: c.gossipLearned.Load(), GossipDropped: c.gossipDropped.Load(),
	}
	for i := range c.drops {
		s.Drops[i] = c.drops[i].Load()
	}
	return s
}
