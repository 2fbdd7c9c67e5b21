// Package soft is an in-process InfiniBand fabric: devices that implement
// the hca verbs contract by copying bytes between queue pairs of one
// process, with seeded, reproducible fault injection.
//
// The model follows rxe, the kernel's soft RoCE HCA, where it matters to
// IPoIB: RC sends land in the peer's posted receive buffer (its SRQ if it
// has one), a missing buffer produces RNR NAKs retried per the IBTA RNR
// timer table, an unreachable peer exhausts the transport retry count, a
// QP moved to Error flushes its work with WR_FLUSH_ERR and raises
// LAST_WQE_REACHED once if it is SRQ-attached, and completions already in a
// CQ survive the destroy of their QP (they carry the QP's context).
//
// Addressing: device i (counting from 1 in creation order) has port GID
// fe80::<i>, i.e. the link-local prefix with the index in the low 32 bits,
// and the P_Key table {Config.PKey}. UD receive buffers get the payload at
// offset 0 (no 40-byte GRH is written); the source GID is in the WC.
//
// Concurrency: one fabric lock (like one switch) guards every QP, SRQ and
// device; a send batch takes it once. Each CQ has its own lock so polling
// does not contend with posting. Completion events and asynchronous events
// are delivered by one dispatcher goroutine per fabric, in order and outside
// every lock, so handlers may call back into any verb; posting never calls
// the consumer synchronously. The exception is a CQ created with
// hca.CQConfig.InlineCompletion: its completion event is collected while the
// fabric lock is held and delivered when the lock is released, by the
// goroutine that caused it, which saves the dispatcher's wake-up on the data
// path. Timed work (RNR and transport retries,
// delayed completions, delayed LAST_WQE_REACHED) runs on one scheduler
// goroutine. Close stops both.
//
// Delayed completions (Faults.CompletionDelay) are held per CQ: once one
// completion of a CQ is held back, every later completion of that CQ queues
// behind it until released, so the order of every QP's completion stream,
// and the "flush behind every earlier completion" rule IPoIB's drain work
// request depends on, both still hold. Fabric.HoldCompletions, for tests,
// holds a CQ's completions the same way until the test passes or releases
// them.
package soft
