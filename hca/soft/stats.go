package soft

import "sync/atomic"

// UDDrops counts UD deliveries the fabric discarded, per reason. Multicast
// counts once per destination QP.
type UDDrops struct {
	QKey     uint64 // destination Q_Key differs from the work request's
	PKey     uint64 // partitions do not match
	NoQP     uint64 // no such QP, or it is not in RTR/RTS
	Loss     uint64 // Faults.UDLoss
	NoBuffer uint64 // destination had no receive buffer posted
	TooBig   uint64 // message longer than the port MTU
	LinkDown uint64 // sender's or receiver's port is down
}

// Total is the sum over all reasons.
func (d UDDrops) Total() uint64 {
	return d.QKey + d.PKey + d.NoQP + d.Loss + d.NoBuffer + d.TooBig + d.LinkDown
}

// FabricStats is a snapshot of the fabric's objects and counters.
type FabricStats struct {
	// Live objects.
	Devices, QPs, CQs, SRQs, AHs int
	GSIQPs                       int // QP 1s, one per device that runs a CM
	McastAttachments             int // (QP, group) pairs
	Goroutines                   int // fabric goroutines still running; 0 after Close
	PendingCompletion            int // completions held back by CompletionDelay or HoldCompletions

	RCMessages uint64 // RC messages delivered into a receive buffer
	UDMessages uint64 // UD copies delivered into a receive buffer
	// UDLSOSegments counts the UD messages that were segments of an LSO
	// send (included in UDMessages).
	UDLSOSegments uint64

	// CompletionsAfterDestroy counts completions Poll returned after their
	// QP had been destroyed.
	CompletionsAfterDestroy uint64
	// DestroyedQPOps counts PostSend/PostRecv/Modify/AttachMcast/
	// DetachMcast/Destroy calls on an already destroyed QP; every one
	// returned an error wrapping hca.ErrDestroyed.
	DestroyedQPOps uint64

	UDDrops            UDDrops
	CQOverflows        uint64 // completions lost to a full CQ (CQ_ERR raised)
	RNRNaks            uint64 // RC receives that found no buffer
	TransportRetries   uint64 // RC sends retried because the peer was unreachable
	DelayedCompletions uint64 // completions held back by CompletionDelay
	SpuriousEvents     uint64 // completion events fired with nothing new
	PurgedCompletions  uint64 // CQEs removed at QP destroy (purge policy)
	LastWQEReached     uint64 // LAST_WQE_REACHED events raised
	// InlineEvents counts completion events delivered inline, by the
	// goroutine that caused them (CQConfig.InlineCompletion);
	// DispatchedEvents those delivered by the dispatcher goroutine.
	InlineEvents     uint64
	DispatchedEvents uint64
}

// counters are the fabric's atomically updated statistics.
type counters struct {
	rcMessages, udMessages          atomic.Uint64
	completionsAfterDestroy         atomic.Uint64
	destroyedQPOps                  atomic.Uint64
	udQKey, udPKey, udNoQP, udLoss  atomic.Uint64
	udNoBuffer, udTooBig, udLinkDwn atomic.Uint64
	cqOverflows, rnrNaks, retries   atomic.Uint64
	delayed, spurious, purged       atomic.Uint64
	lastWQE                         atomic.Uint64
	udLSOSegments                   atomic.Uint64
	inlineEvents, dispatchedEvents  atomic.Uint64
}

func (c *counters) fill(s *FabricStats) {
	s.RCMessages = c.rcMessages.Load()
	s.UDMessages = c.udMessages.Load()
	s.UDLSOSegments = c.udLSOSegments.Load()
	s.CompletionsAfterDestroy = c.completionsAfterDestroy.Load()
	s.DestroyedQPOps = c.destroyedQPOps.Load()
	s.UDDrops = UDDrops{
		QKey: c.udQKey.Load(), PKey: c.udPKey.Load(), NoQP: c.udNoQP.Load(),
		Loss: c.udLoss.Load(), NoBuffer: c.udNoBuffer.Load(),
		TooBig: c.udTooBig.Load(), LinkDown: c.udLinkDwn.Load(),
	}
	s.CQOverflows = c.cqOverflows.Load()
	s.RNRNaks = c.rnrNaks.Load()
	s.TransportRetries = c.retries.Load()
	s.DelayedCompletions = c.delayed.Load()
	s.SpuriousEvents = c.spurious.Load()
	s.PurgedCompletions = c.purged.Load()
	s.LastWQEReached = c.lastWQE.Load()
	s.InlineEvents = c.inlineEvents.Load()
	s.DispatchedEvents = c.dispatchedEvents.Load()
}
