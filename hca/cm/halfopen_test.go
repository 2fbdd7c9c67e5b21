package cm

import (
	"testing"
	"testing/synctest"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// rawREQ marshals a REQ for ietfSID with its own comm ID and TID.
func rawREQ(t *testing.T, commID uint32, tid uint64) []byte {
	t.Helper()
	r := goldenREQ()
	r.ServiceID, r.LocalCommID, r.TransactionID = ietfSID, commID, tid
	buf := make([]byte, MADSize)
	if err := r.Marshal(buf); err != nil {
		t.Fatal(err)
	}
	return buf
}

// sentMADs is every MAD the Manager posted.
func sentMADs(s Stats) uint64 {
	var n uint64
	for _, v := range s.Sent {
		n += v
	}
	return n
}

// checkREQOutcomes: every REQ received is counted under one outcome.
func checkREQOutcomes(t *testing.T, s Stats) {
	t.Helper()
	var sum uint64
	for _, v := range s.REQs {
		sum += v
	}
	if sum != s.Received[MsgREQ] {
		t.Fatalf("REQ outcomes %v sum to %d, %d REQs received", s.REQs, sum, s.Received[MsgREQ])
	}
}

// TestUnverifiedBudget: a source that sends REQs and never an RTU gets at
// most two MADs per REQ, paced by the REQ's response timeout: the REP,
// one resend, and for its duplicate REQ two more resends; then the
// handshake ends without a REJ.
func TestUnverifiedBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(2)
		b := newNode(t, f, "b", opts)
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		req := rawREQ(t, 0x51, 0x100)
		iv := convertToMS(goldenREQ().LocalCMResponseTimeout) // the REP's resend interval
		raw.send(b.dev.GID(), req)
		settle(iv + iv/2) // REP, one resend
		if s := b.m.Stats(); s.Sent[MsgREP] != 2 || s.HalfOpen != 1 {
			t.Fatalf("after one timeout: %+v", s)
		}
		raw.send(b.dev.GID(), req) // the duplicate buys two more, spent by the timer
		settle(10 * iv)
		s := b.m.Stats()
		if s.Received[MsgREQ] != 2 || s.Sent[MsgREP] != 4 || sentMADs(s) != 4 || s.UnverifiedGiveUps != 1 ||
			s.RejSent[RejectTimeout] != 0 || s.HalfOpen != 0 || s.LiveConns != 0 {
			t.Fatalf("stats %+v", s)
		}
		if sentMADs(s) > unverifiedMADsPerREQ*s.Received[MsgREQ] {
			t.Fatalf("sent %d MADs for %d REQs", sentMADs(s), s.Received[MsgREQ])
		}
		checkREQOutcomes(t, s)
		if got := acc.rec.types(acc.conns()[0]); !eq(got, []EventType{EventTimedOut}) {
			t.Fatalf("events %v", got)
		}
	})
}

// TestHalfOpenPerGIDLimit: REQs from one source beyond MaxHalfOpenPerGID
// are rejected NO_RESOURCES and counted; the slots free when the
// handshakes end.
func TestHalfOpenPerGIDLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(2)
		opts.MaxHalfOpenPerGID = 8
		b := newNode(t, f, "b", opts)
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		for k := range 12 {
			raw.send(b.dev.GID(), rawREQ(t, uint32(0x100+k), uint64(0x200+k)))
		}
		synctest.Wait()
		s := b.m.Stats()
		if s.REQs[REQToListener] != 8 || s.REQs[REQHalfOpenPerGID] != 4 || s.RejSent[RejectNoResources] != 4 ||
			s.HalfOpen != 8 || s.MaxHalfOpenPerGID != 8 {
			t.Fatalf("stats %+v", s)
		}
		checkREQOutcomes(t, s)
		settle(10 * convertToMS(goldenREQ().LocalCMResponseTimeout))
		if s := b.m.Stats(); s.HalfOpen != 0 || s.LiveConns != 0 {
			t.Fatalf("after the handshakes ended: %+v", s)
		}
		raw.send(b.dev.GID(), rawREQ(t, 0x300, 0x400))
		synctest.Wait()
		if s := b.m.Stats(); s.REQs[REQToListener] != 9 || s.HalfOpen != 1 {
			t.Fatalf("a REQ after the slots freed: %+v", s)
		}
	})
}

// TestHalfOpenEvictsHeaviest: when the half-open set is full, a REQ from
// a peer with no pending handshake evicts one of the source that holds
// the most, and the peer connects.
func TestHalfOpenEvictsHeaviest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(2)
		opts.MaxHalfOpen, opts.MaxHalfOpenPerGID = 4, 4
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", opts)
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		for k := range 4 {
			raw.send(b.dev.GID(), rawREQ(t, uint32(0x100+k), uint64(0x200+k)))
		}
		synctest.Wait()
		flood := acc.conns()
		rec := newRecorder()
		c, _ := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		if c.State() != StateEstablished {
			t.Fatalf("legitimate peer: %s", c.State())
		}
		s := b.m.Stats()
		if s.HalfOpenEvicted != 1 || s.HalfOpen != 3 || s.REQs[REQToListener] != 5 {
			t.Fatalf("stats %+v", s)
		}
		checkREQOutcomes(t, s)
		// The oldest flood handshake went, told as a timeout.
		if got := acc.rec.types(flood[0]); !eq(got, []EventType{EventTimedOut}) {
			t.Fatalf("evicted handshake events %v", got)
		}
		for _, pc := range flood[1:] {
			if pc.State() != StateREPSent {
				t.Fatalf("flood handshake %v in %s", pc, pc.State())
			}
		}
		settle(10 * convertToMS(goldenREQ().LocalCMResponseTimeout))
		if s := b.m.Stats(); s.HalfOpen != 0 || s.LiveConns != 1 {
			t.Fatalf("after the flood's handshakes ended: %+v", s)
		}
	})
}
