// Package napi polls a completion queue the way Linux NAPI polls a device:
// the completion event only schedules a poll, the poll drains completions up
// to a budget under a poll lock, and a poll that finishes under budget
// "completes" by re-arming the CQ with missed-event reporting.
//
// One Context serves one hca.CQ with exactly one goroutine. Its life:
//
//	New ──Start──▶ running ──Stop──▶ stopped
//
// While running, the goroutine sleeps until Schedule (wired to
// hca.CQConfig.OnCompletion) wakes it, then loops:
//
//  1. poll: take the poll lock, call CQ.Poll in batches of
//     min(Batch, Budget-done) and Handle for each non-empty batch, never
//     more than Budget completions;
//  2. if the budget was used up, release the lock, yield the processor and
//     poll again without re-arming (the CQ is still busy, and another
//     Context on the same core deserves a turn);
//  3. otherwise complete: Config.Complete (where a consumer flushes what it
//     kept across exhausted polls, as napi_complete_done flushes GRO), then
//     CQ.Notify(true). If the CQ reports completions
//     that arrived between the last Poll and the re-arm, no event will come
//     for them, so poll again at once. This is the no-lost-wake-up rule of
//     ib_req_notify_cq(IB_CQ_REPORT_MISSED_EVENTS).
//
// Schedule coalesces: a burst of events while a poll is pending or running
// causes one more poll, not one per event.
//
// Sync runs a function under the poll lock, which is how a consumer changes
// state that Handle reads (IPoIB marks a connection dead this way before
// destroying its QP): when fn runs, no poll that began before Sync is still
// running and none can start until fn returns.
//
// The one rule a consumer must keep: never call Sync or Stop from Handle.
// Both wait for the running poll, which is the caller itself. napi does
// not detect the mistake (Go gives a goroutine no identity to check
// against); a consumer keeps the rule by structure, calling Sync and Stop
// only from goroutines of its own that Handle never waits for.
//
// BusyPoll lets a producer reap completions itself, on its own goroutine,
// as Linux's busy polling and the TX reaping of mlx4/mlx5's transmit path
// do: it polls under the same lock (TryLock: it never waits for a running
// poll), and while a busy poller is active the goroutine's polls end
// without re-arming, so completions the busy poller reaps raise no event.
// The busy poller gives re-arming back with EndBusyPoll before it stops
// polling with completions still to come; the no-lost-wake-up rule then
// holds as before.
//
// With Config.Inline, Schedule polls on its caller's goroutine when the
// poll lock is free (TryLock: it never waits), as Linux runs the NET_RX
// softirq on the CPU that raised it, once the poster leaves its critical
// section: wired to a CQ whose backend raises completion events inside
// the poster's verb call (hca.CQConfig.InlineCompletion), the poster
// handles its own completions and the goroutine is not woken. The inline
// poll is one poll, re-arming as any other; what it leaves (a used-up
// budget, completions the re-arm reported) goes to the goroutine. Its
// Handle runs under the poster's locks, whatever they are, so it must not
// block on a lock: Inline tells it where it runs, and Defer hands the
// goroutine the completions it cannot handle there, which the goroutine
// handles first, before anything newer (no inline poll runs while any
// are deferred), or Stop does, if it comes first.
//
// napi does not know what a completion means; Handle does.
package napi
