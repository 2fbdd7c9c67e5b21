// Package hca is the verbs contract between IPoIB and a host channel adapter.
//
// It describes devices, completion queues, queue pairs (RC, UD and the GSI
// QP 1), shared receive queues, address handles, work requests, work
// completions and asynchronous events, in the shape of the InfiniBand verbs
// (IBTA Vol 1 ch. 10-11) and of Linux's ib_verbs. Backends (hca/soft,
// hca/rocev2) implement it and prove it with the conformance suite in
// hca/hcatest.
//
// Contract points every consumer may rely on:
//
//   - A work completion carries the context value given to its QP at
//     creation, never the QP itself. A backend may deliver completions for a
//     QP after that QP was destroyed (IBTA 10.2.4.4 permits it).
//   - Completions of one QP on one CQ arrive in the order the work was
//     posted; a send posted on a QP in the Error state completes with
//     StatusWRFlushErr behind every completion already queued on its CQ.
//   - Asynchronous events are delivered outside backend locks, and
//     EventQPLastWQEReached exactly once per SRQ-attached QP.
//   - CQ.Notify(true) arms the CQ and reports whether completions may have
//     been missed, so a poller that re-arms never loses a wake-up.
//   - Posting never blocks and never calls back into the consumer
//     synchronously, with one opt-in exception: the completion event of a
//     CQ created with CQConfig.InlineCompletion may run inside the verb
//     call that produced the completion, after backend locks are released.
//     Such a handler must not block or take a lock a poster may hold.
//   - Partitions (IBTA 10.9): every UD and RC packet carries the P_Key at
//     its QP's index (QPAttr.PKeyIndex at Init), a GSI send the one at
//     SendWR.PKeyIndex. A receiver accepts a packet only if PKey.Matches
//     holds against its QP's P_Key (for QP 1: against any entry of the
//     port's table) and counts every other in Port.PKeyViolations. A
//     rewritten table raises EventPortPKeyChange; QPs keep their index.
//   - A UD receive buffer holds the payload from offset 0: unlike the
//     verbs API there is no 40-byte GRH in front, the source GID is in the
//     work completion instead (SrcGID), so buffers need no GRH headroom.
package hca
