package ipoibcm

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// A receiver whose host write has stalled takes a burst larger than its
// SRQ. The peer asks for RNR retry 0, as Linux's does, so with a fixed SRQ
// the first receive that finds it empty fails the sender's QP; a growing
// SRQ doubles on the limit event and holds the whole burst, which reaches
// the host once the write resumes.
func TestSRQGrowsWhileHostWriteStalls(t *testing.T) {
	for _, tc := range []struct {
		name     string
		max      int
		fixedSRQ bool
	}{
		{name: "grows", max: 32},
		{name: "fixed", max: 8, fixedSRQ: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const first = 8
			fab := rvFabric(t, 31)
			pa := rvNewCapture(1)
			var stalled atomic.Bool
			resume := make(chan struct{})
			release := sync.OnceFunc(func() { close(resume) })
			var got atomic.Int64
			pb := newMemPort(2, func(fs [][]byte) {
				if stalled.Load() {
					<-resume
				}
				for _, f := range fs {
					if rvIsIPv4(f) {
						got.Add(1)
					}
				}
			})
			a := rvStart(t, fab, "a", pa, nil)
			b := rvStart(t, fab, "b", pb, func(c *Config) { c.RecvQueueSize, c.MaxRecvQueueSize = first, tc.max })
			t.Cleanup(release) // before Close: a failed test must not leave the poller stalled
			mac := rvLearn(a, b.HWAddr(), netip.AddrFrom4([4]byte{10, 0, 0, 2}), time.Now())
			send := func() {
				pa.in <- rvIPv4(mac, frame.MAC(pa.mac), [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 200)
			}
			waitFor := func(what string, cond func() bool) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for !cond() {
					if time.Now().After(deadline) {
						t.Fatalf("timed out waiting for %s; receiver: SRQ %d posted of %d, grown %d; sender: tx_send_error %d",
							what, b.srq.srq.Posted(), b.srq.size.Load(), b.srq.grown.Load(), a.Stats().Drops["tx_send_error"])
					}
					time.Sleep(time.Millisecond)
				}
			}
			inUse := func() int { return int(b.srq.size.Load()) - b.srq.srq.Posted() }

			send() // connects; the receive is written and reposted
			waitFor("the first frame", func() bool { return got.Load() == 1 })
			stalled.Store(true)

			if tc.fixedSRQ {
				for range first + 4 {
					send()
				}
				waitFor("the sender's QP to fail", func() bool { return a.Stats().Drops["tx_send_error"] > 0 })
				if st := b.Stats(); st.SRQSize != first || st.SRQGrown != 0 {
					t.Fatalf("fixed SRQ: size %d, grown %d; want %d, 0", st.SRQSize, st.SRQGrown, first)
				}
				return
			}
			const burst = 24
			for k := range burst {
				// One frame at a time, each in a buffer before the next,
				// and a buffer posted for it: the growth runs on the
				// control loop, concurrently with the deliveries.
				waitFor("a posted buffer", func() bool { return b.srq.srq.Posted() > 0 })
				send()
				waitFor("the frame in the SRQ", func() bool { return inUse() == k+1 })
			}
			st := b.Stats()
			if st.SRQSize != tc.max || st.SRQGrown != 2 {
				t.Fatalf("SRQ size %d, grown %d; want %d after doubling twice from %d", st.SRQSize, st.SRQGrown, tc.max, first)
			}
			if n := a.Stats().Drops["tx_send_error"]; n != 0 {
				t.Fatalf("tx_send_error %d while the SRQ grew, want 0", n)
			}
			release()
			waitFor("the burst at the host", func() bool { return got.Load() == 1+burst })
			waitFor("every buffer reposted", func() bool { return b.srq.srq.Posted() == tc.max })
			if st := b.Stats(); st.SRQPosted != st.SRQSize {
				t.Fatalf("SRQ posted %d of %d after the burst", st.SRQPosted, st.SRQSize)
			}
		})
	}
}
