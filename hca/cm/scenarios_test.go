package cm

import (
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

func TestRejectInvalidServiceID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		rec := newRecorder()
		c, qp := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		ev, ok := rec.last(c)
		if !ok || ev.Type != EventRejected || ev.RejectReason != RejectInvalidServiceID {
			t.Fatalf("event %+v", ev)
		}
		if c.State() != StateIdle || qp.State() != hca.QPStateInit {
			t.Fatalf("state %s, QP %s", c.State(), qp.State())
		}
		if a.m.Stats().RejReceived[RejectInvalidServiceID] != 1 || b.m.Stats().RejSent[RejectInvalidServiceID] != 1 {
			t.Fatalf("REJ counters a %+v b %+v", a.m.Stats(), b.m.Stats())
		}
		if a.m.Stats().LiveConns != 0 || b.m.Stats().LiveConns != 0 {
			t.Fatal("connections left behind")
		}
	})
}

func TestListenerRejects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		acc.decide = func(*Request) Decision { return Decision{Reject: RejectNoQP} }
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); !errors.Is(err, ErrServiceIDInUse) {
			t.Fatalf("second Listen: %v", err)
		}
		rec := newRecorder()
		c, _ := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		if ev, _ := rec.last(c); ev.Type != EventRejected || ev.RejectReason != RejectNoQP {
			t.Fatalf("event %+v", ev)
		}
		if b.m.Stats().LiveConns != 0 {
			t.Fatal("passive connection left behind")
		}
	})
}

func TestRejectAtREP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		var mtu []byte
		rec.onREP = func(ev Event) {
			mtu = ev.PrivateData[4:8]
			if err := ev.Conn.Reject(RejectConsumerDefined); err != nil {
				t.Error(err)
			}
		}
		c, _ := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		if string(mtu) != "\x00\x00\xff\xf4" {
			t.Fatalf("REP private data MTU %x", mtu)
		}
		pc := acc.conns()[0]
		if ev, _ := acc.rec.last(pc); ev.Type != EventRejected || ev.RejectReason != RejectConsumerDefined {
			t.Fatalf("passive event %+v", ev)
		}
		if a.m.Stats().Sent[MsgRTU] != 0 || c.State() != StateTimeWait {
			t.Fatalf("RTU sent %d, state %s", a.m.Stats().Sent[MsgRTU], c.State())
		}
		settle(20 * time.Millisecond)
		if got := rec.types(c); !eq(got, []EventType{EventREPReceived, EventTimeWaitExit}) {
			t.Fatalf("active events %v", got)
		}
	})
}

func TestTimedOutNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(1)
		opts.MaxRetries = 3
		a := newNode(t, f, "a", opts)
		silent, err := f.NewDevice("silent") // no Manager: nobody answers
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		c, err := a.m.Connect(ConnectParams{DestGID: silent.GID(), ServiceID: ietfSID, QP: a.rcQP(), PathMTU: hca.MTU1024}, rec.handle)
		if err != nil {
			t.Fatal(err)
		}
		iv := reqInterval(opts)
		settle(3*iv + iv/2)
		if c.State() != StateREQSent || len(rec.types(c)) != 0 {
			t.Fatalf("gave up early: %s %v", c.State(), rec.types(c))
		}
		settle(iv)
		if got := rec.types(c); !eq(got, []EventType{EventTimedOut}) {
			t.Fatalf("events %v", got)
		}
		// cm_process_send_error: giving up sends nothing.
		s := a.m.Stats()
		if s.Sent[MsgREQ] != 4 || s.Retries != 3 || s.Timeouts != 1 || s.Sent[MsgREJ] != 0 || s.LiveConns != 0 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// TestDeferredDecisionSendsMRA: while the listener has not decided, a
// retried REQ gets an MRA that stretches the active side's timeout, so it
// outlives its retry budget and still connects.
func TestDeferredDecisionSendsMRA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(1)
		opts.MaxRetries = 1
		a := newNode(t, f, "a", opts)
		bopts := testOptions(2)
		bopts.ResponseTimeout = 200 * time.Millisecond // MRA asks for ~268ms more
		b := newNode(t, f, "b", bopts)
		acc := newAcceptor(b)
		var pending *Request
		acc.decide = func(r *Request) Decision { pending = r; return Decision{Defer: true, Handler: acc.rec.handle} }
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		c, _ := a.connect(b, ietfSID, rec.handle)
		settle(reqInterval(opts) + time.Millisecond) // one retry: duplicate REQ -> MRA
		if b.m.Stats().Sent[MsgMRA] != 1 || a.m.Stats().Received[MsgMRA] != 1 {
			t.Fatalf("MRA: b %+v a %+v", b.m.Stats(), a.m.Stats())
		}
		settle(5 * reqInterval(opts)) // past the retry budget without the MRA
		if c.State() != StateREQSent || len(rec.types(c)) != 0 {
			t.Fatalf("active side gave up despite MRA: %s %v", c.State(), rec.types(c))
		}
		if pending.Conn.State() != StateREQReceived {
			t.Fatalf("passive state %s", pending.Conn.State())
		}
		if err := pending.Conn.Accept(acc.decision(pending)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if c.State() != StateEstablished || pending.Conn.State() != StateEstablished {
			t.Fatalf("states %s / %s", c.State(), pending.Conn.State())
		}
		if err := pending.Conn.Accept(acc.decision(pending)); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("second Accept: %v", err)
		}
	})
}

func TestLossyFabricThousandConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{UDLoss: 0.1})
		const n = 1000
		a := newNode(t, f, "a", testOptions(1))
		// One peer opening a thousand connections at once is not a flood
		// here: make room for all its handshakes.
		bopts := testOptions(2)
		bopts.MaxHalfOpen, bopts.MaxHalfOpenPerGID = n, n
		b := newNode(t, f, "b", bopts)
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		conns := make([]*Conn, n)
		for i := range conns {
			conns[i], _ = a.connect(b, ietfSID, rec.handle)
		}
		// Worst case: 16 attempts of REQ, then of REP, then time-wait.
		settle(3 * 16 * reqInterval(testOptions(1)))
		var established, timedOut int
		for _, c := range conns {
			got := rec.types(c)
			switch {
			case eq(got, []EventType{EventREPReceived, EventEstablished}):
				established++
			case eq(got, []EventType{EventTimedOut}):
				timedOut++
			default:
				t.Fatalf("conn %v ended with events %v in %s", c, got, c.State())
			}
		}
		sa, sb := a.m.Stats(), b.m.Stats()
		t.Logf("established %d, timed out %d; a: %d retries; b: %d retries, %d duplicate REQs",
			established, timedOut, sa.Retries, sb.Retries, sb.DuplicateREQs)
		if established < n*99/100 {
			t.Fatalf("only %d of %d established", established, n)
		}
		if sa.Retries == 0 || sb.Retries+sb.DuplicateREQs == 0 {
			t.Fatal("10% loss caused no retries")
		}
		// Every passive connection whose RTU was lost was recovered by a
		// resent REP and the active side's answering RTU.
		for _, pc := range acc.conns() {
			if s := pc.State(); s != StateEstablished && s != StateIdle {
				t.Fatalf("passive conn stuck in %s", s)
			}
		}
	})
}

// TestSimultaneousDisconnect: both sides call Disconnect before either
// hears the other's DREQ. Holding both GSI CQs' completions makes that a
// fact instead of a race the fabric's goroutines may win: the DREQs are
// delivered but neither Manager sees one until both sides have sent theirs.
// Each DREQ then answers the other's: both sides report EventDisconnected
// (not EventDisconnectRequested), each sends one DREQ and one DREP, and
// neither retries.
func TestSimultaneousDisconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		c, _ := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		pc := acc.conns()[0]
		holdA := holdGSI(t, f, a)
		holdB := holdGSI(t, f, b)
		if err := c.Disconnect(); err != nil {
			t.Fatal(err)
		}
		if err := pc.Disconnect(); err != nil {
			t.Fatal(err)
		}
		if err := c.Disconnect(); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("second Disconnect: %v", err)
		}
		synctest.Wait()
		// Both DREQs (and their send completions) wait in the holds.
		if st := f.Stats(); c.State() != StateDREQSent || pc.State() != StateDREQSent || st.PendingCompletion != 4 {
			t.Fatalf("held: states %s / %s, %d completions held, want DREQ_SENT twice and 4", c.State(), pc.State(), st.PendingCompletion)
		}
		holdA.Release()
		holdB.Release()
		synctest.Wait()
		if c.State() != StateTimeWait || pc.State() != StateTimeWait {
			t.Fatalf("states %s / %s", c.State(), pc.State())
		}
		settle(20 * time.Millisecond)
		if got := rec.types(c); !eq(got, []EventType{EventREPReceived, EventEstablished, EventDisconnected, EventTimeWaitExit}) {
			t.Fatalf("active events %v", got)
		}
		if got := acc.rec.types(pc); !eq(got, []EventType{EventEstablished, EventDisconnected, EventTimeWaitExit}) {
			t.Fatalf("passive events %v", got)
		}
		for _, s := range []Stats{a.m.Stats(), b.m.Stats()} {
			if s.Sent[MsgDREQ] != 1 || s.Sent[MsgDREP] != 1 || s.Received[MsgDREQ] != 1 || s.Received[MsgDREP] != 1 ||
				s.Retries != 0 || s.LiveConns != 0 {
				t.Fatalf("stats %+v", s)
			}
		}
	})
}

// TestDisconnectAfterPeerDREQ is the other order of two disconnects: the
// active side's DREQ reaches the passive side, which answers it and enters
// time-wait, before the passive side calls Disconnect. That call is then
// refused (the connection is already going down) and sends nothing: the
// passive side reports EventDisconnectRequested, the active side
// EventDisconnected, and the fabric carries one DREQ and one DREP.
func TestDisconnectAfterPeerDREQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		c, _ := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		pc := acc.conns()[0]
		if err := c.Disconnect(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the DREQ is delivered and answered
		if c.State() != StateTimeWait || pc.State() != StateTimeWait {
			t.Fatalf("after DREQ/DREP: states %s / %s", c.State(), pc.State())
		}
		if err := pc.Disconnect(); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("passive Disconnect after the peer's DREQ: %v, want %v", err, ErrInvalidState)
		}
		settle(20 * time.Millisecond)
		if got := rec.types(c); !eq(got, []EventType{EventREPReceived, EventEstablished, EventDisconnected, EventTimeWaitExit}) {
			t.Fatalf("active events %v", got)
		}
		if got := acc.rec.types(pc); !eq(got, []EventType{EventEstablished, EventDisconnectRequested, EventTimeWaitExit}) {
			t.Fatalf("passive events %v", got)
		}
		sa, sb := a.m.Stats(), b.m.Stats()
		if sa.Sent[MsgDREQ] != 1 || sa.Sent[MsgDREP] != 0 || sb.Sent[MsgDREQ] != 0 || sb.Sent[MsgDREP] != 1 ||
			sa.Retries != 0 || sb.Retries != 0 || sa.LiveConns != 0 || sb.LiveConns != 0 {
			t.Fatalf("stats a %+v b %+v", sa, sb)
		}
	})
}

// TestPeerRestart: A's host restarts (its Manager vanishes without DREQ)
// while B still holds the passive connection as established. With new
// QPNs the first REQ connects; with the old QPN reused the first REQ is
// rejected as STALE_CONN, the old connection hears EventStale, and the
// retry connects at once, before the consumer even tore the old one down.
func TestPeerRestart(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		name := map[bool]string{false: "new QPNs", true: "QPN reused"}[reuse]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newTestFabric(t, soft.Faults{ImmediateQPNReuse: reuse})
				a := newNode(t, f, "a", testOptions(1))
				b := newNode(t, f, "b", testOptions(2))
				acc := newAcceptor(b)
				if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
					t.Fatal(err)
				}
				_, oldQP := a.connect(b, ietfSID, newRecorder().handle)
				synctest.Wait()
				old := acc.conns()[0]
				if err := a.m.Close(); err != nil {
					t.Fatal(err)
				}
				oldQPN := oldQP.QPN()
				if err := oldQP.Destroy(); err != nil {
					t.Fatal(err)
				}
				a.startManager(testOptions(3)) // same device and GID
				rec := newRecorder()
				c, qp := a.connect(b, ietfSID, rec.handle)
				synctest.Wait()
				if (qp.QPN() == oldQPN) != reuse {
					t.Fatalf("QPN %d, old %d", qp.QPN(), oldQPN)
				}
				if !reuse {
					if c.State() != StateEstablished || !eq(acc.rec.types(old), []EventType{EventEstablished}) {
						t.Fatalf("new QPN: %s, old conn events %v", c.State(), acc.rec.types(old))
					}
					return
				}
				if ev, _ := rec.last(c); ev.Type != EventRejected || ev.RejectReason != RejectStaleConn {
					t.Fatalf("first REQ: %+v", ev)
				}
				if got := acc.rec.types(old); !eq(got, []EventType{EventEstablished, EventStale}) {
					t.Fatalf("old conn events %v", got)
				}
				if b.m.Stats().StaleREQs != 1 || a.m.Stats().RejReceived[RejectStaleConn] != 1 {
					t.Fatalf("stale counters b %+v a %+v", b.m.Stats(), a.m.Stats())
				}
				c2, _ := a.connect(b, ietfSID, rec.handle)
				synctest.Wait()
				if c2.State() != StateEstablished {
					t.Fatalf("retry: %s", c2.State())
				}
				// The consumer tears the stale connection down; the
				// restarted Manager answers its DREQ without knowing it.
				old.Destroy()
				settle(20 * time.Millisecond)
				if a.m.Stats().UnknownDREQs != 1 || b.m.Stats().Received[MsgDREP] != 1 {
					t.Fatalf("stale teardown: a %+v b %+v", a.m.Stats(), b.m.Stats())
				}
			})
		})
	}
}

// TestStaleSameCommID: a REQ with the comm ID of an established
// connection but a new transaction (a restarted peer drew the same comm
// ID) is stale; a third REQ then gets a fresh connection.
func TestStaleSameCommID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		req := goldenREQ()
		req.ServiceID = ietfSID
		send := func(tid uint64, qpn hca.QPN) {
			req.TransactionID, req.LocalQPN = tid, qpn
			buf := make([]byte, MADSize)
			if err := req.Marshal(buf); err != nil {
				t.Fatal(err)
			}
			raw.send(b.dev.GID(), buf)
			synctest.Wait()
		}
		send(1, 0x500)
		first := acc.conns()[0]
		first.NotifyEstablished()
		synctest.Wait()
		send(1, 0x500) // a true duplicate: ignored
		if b.m.Stats().DuplicateREQs != 1 || len(acc.conns()) != 1 {
			t.Fatalf("duplicate: %+v", b.m.Stats())
		}
		send(2, 0x600)
		if got := acc.rec.types(first); !eq(got, []EventType{EventEstablished, EventStale}) {
			t.Fatalf("old conn events %v", got)
		}
		if b.m.Stats().RejSent[RejectStaleConn] != 1 || len(acc.conns()) != 1 {
			t.Fatalf("stale: %+v", b.m.Stats())
		}
		send(3, 0x600)
		if len(acc.conns()) != 2 || acc.conns()[1].State() != StateREPSent {
			t.Fatalf("third REQ: %d conns", len(acc.conns()))
		}
	})
}

func TestDestroyEstablishedSendsDREQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		c, _ := a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		c.Destroy()
		settle(20 * time.Millisecond)
		if got := rec.types(c); !eq(got, []EventType{EventREPReceived, EventEstablished}) {
			t.Fatalf("events after Destroy %v", got)
		}
		pc := acc.conns()[0]
		if got := acc.rec.types(pc); !eq(got, []EventType{EventEstablished, EventDisconnectRequested, EventTimeWaitExit}) {
			t.Fatalf("passive events %v", got)
		}
		if a.m.Stats().LiveConns != 0 || b.m.Stats().LiveConns != 0 {
			t.Fatal("connections left")
		}
		// Destroying a pending REQ rejects it with TIMEOUT.
		silent, _ := f.NewDevice("silent")
		c2, err := a.m.Connect(ConnectParams{DestGID: silent.GID(), ServiceID: 1, QP: a.rcQP(), PathMTU: hca.MTU256}, rec.handle)
		if err != nil {
			t.Fatal(err)
		}
		c2.Destroy()
		if c2.State() != StateIdle || a.m.Stats().RejSent[RejectTimeout] != 1 {
			t.Fatalf("destroy REQ_SENT: %s %+v", c2.State(), a.m.Stats())
		}
	})
}

func TestPassiveEstablishedOnFirstReceive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		rec.onREP = func(ev Event) {
			// The consumer's parked packet reaches the passive side before
			// the RTU; its first receive establishes the connection.
			pc := acc.conns()[0]
			pc.NotifyEstablished()
			pc.NotifyEstablished() // idempotent
		}
		a.connect(b, ietfSID, rec.handle)
		synctest.Wait()
		pc := acc.conns()[0]
		if got := acc.rec.types(pc); !eq(got, []EventType{EventEstablished}) {
			t.Fatalf("passive events %v", got)
		}
		if b.m.Stats().Dropped[DropUnexpected] != 0 || b.m.Stats().Received[MsgRTU] != 1 {
			t.Fatalf("late RTU mishandled: %+v", b.m.Stats())
		}
	})
}

func TestMalformedMADsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		good := func(m Message) []byte {
			buf := make([]byte, MADSize)
			if err := m.Marshal(buf); err != nil {
				t.Fatal(err)
			}
			return buf
		}
		with := func(b []byte, off int, v byte) []byte { b[off] = v; return b }
		garbage := make([]byte, MADSize)
		for i := range garbage {
			garbage[i] = byte(i*37 + 11)
		}
		mads := map[DropReason][][]byte{
			DropShort:        {good(&RTU{})[:100], {}},
			DropLong:         {append(good(&RTU{}), make([]byte, 40)...)},
			DropBaseVersion:  {garbage},
			DropMgmtClass:    {with(good(&RTU{}), 1, 0x81)},
			DropClassVersion: {with(good(&RTU{}), 2, 1)},
			DropMethod:       {with(good(&DREQ{}), 3, 0x83)},
			DropAttribute:    {with(good(&RTU{}), 17, 0x17)},
			DropInconsistent: {with(good(goldenREQ()), 24+50, 0x70)},
			DropUnknownConn:  {good(&RTU{RemoteCommID: 12345})},
		}
		for _, list := range mads {
			for _, m := range list {
				raw.send(b.dev.GID(), m)
			}
		}
		synctest.Wait()
		s := b.m.Stats()
		for r, list := range mads {
			if s.Dropped[r] != uint64(len(list)) {
				t.Errorf("dropped %s = %d, want %d", r, s.Dropped[r], len(list))
			}
		}
		// Still working.
		c, _ := a.connect(b, ietfSID, newRecorder().handle)
		synctest.Wait()
		if c.State() != StateEstablished {
			t.Fatalf("after garbage: %s", c.State())
		}
	})
}

// rawGSI is a bare GSI QP on its own device, for injecting MADs.
type rawGSI struct {
	t   *testing.T
	dev *soft.Device
	qp  hca.QP
	buf []byte
	n   int
}

func newRawGSI(t *testing.T, f *soft.Fabric) *rawGSI {
	dev, err := f.NewDevice("raw")
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(hca.CQConfig{Size: 256})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := dev.CreateQP(hca.QPConfig{Type: hca.QPTypeGSI, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []hca.QPState{hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS} {
		if err := qp.Modify(hca.QPAttr{State: s, QKey: hca.QKeyGSI}); err != nil {
			t.Fatal(err)
		}
	}
	buf, _ := dev.Alloc(64 * 512)
	return &rawGSI{t: t, dev: dev, qp: qp, buf: buf}
}

func (r *rawGSI) send(dst hca.GID, mad []byte) {
	ah, err := r.dev.CreateAH(dst)
	if err != nil {
		r.t.Fatal(err)
	}
	b := r.buf[r.n*512 : r.n*512+len(mad)]
	r.n++
	copy(b, mad)
	if _, err := r.qp.PostSend([]hca.SendWR{{ID: uint64(r.n), Data: b, AH: ah, RemoteQPN: hca.QPNGSI, RemoteQKey: hca.QKeyGSI}}); err != nil {
		r.t.Fatal(err)
	}
}

// TestPassiveREPTimeout: the requester vanishes after its REQ; the REP is
// resent after the REQ's Local CM Response Timeout, once: the two MADs
// one REQ buys an unverified source (halfopen.go); at the next timeout
// the passive side gives up silently.
func TestPassiveREPTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(2)
		opts.MaxRetries = 2
		b := newNode(t, f, "b", opts)
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		req := goldenREQ()
		req.ServiceID, req.MaxCMRetries = ietfSID, 15 // the smaller of ours and the REQ's wins
		buf := make([]byte, MADSize)
		if err := req.Marshal(buf); err != nil {
			t.Fatal(err)
		}
		raw.send(b.dev.GID(), buf)
		iv := convertToMS(req.LocalCMResponseTimeout)
		settle(2*iv - time.Millisecond)
		pc := acc.conns()[0]
		if got := acc.rec.types(pc); len(got) != 0 || b.m.Stats().Sent[MsgREP] != 2 {
			t.Fatalf("before the last timeout: events %v, stats %+v", got, b.m.Stats())
		}
		settle(2 * time.Millisecond)
		if got := acc.rec.types(pc); !eq(got, []EventType{EventTimedOut}) {
			t.Fatalf("events %v", got)
		}
		s := b.m.Stats()
		if s.Sent[MsgREP] != 2 || s.Retries != 1 || s.Sent[MsgREJ] != 0 || s.UnverifiedGiveUps != 1 ||
			s.LiveConns != 0 || s.HalfOpen != 0 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// TestREPWithBrokenQP: a QP that cannot go to RTR when the REP arrives
// makes the CM reject the REP instead of sending RTU.
func TestREPWithBrokenQP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		// The QP breaks when the CM moves it to RTR on the REP. (Erroring
		// it after Connect raced the whole handshake: the REP could be
		// applied before the test got to the QP.)
		qp := brokenRTRQP{a.rcQP()}
		c, err := a.m.Connect(ConnectParams{DestGID: b.dev.GID(), ServiceID: ietfSID, QP: qp, PathMTU: hca.MTU1024}, rec.handle)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		ev, _ := rec.last(c)
		if ev.Type != EventRejected || ev.RejectReason != RejectConsumerDefined || !errors.Is(ev.Err, hca.ErrIllegalTransition) {
			t.Fatalf("event %+v", ev)
		}
		pc := acc.conns()[0]
		if got := acc.rec.types(pc); !eq(got, []EventType{EventRejected}) {
			t.Fatalf("passive events %v", got)
		}
		if a.m.Stats().Sent[MsgRTU] != 0 || c.State() != StateTimeWait {
			t.Fatalf("RTU sent or state %s", c.State())
		}
	})
}

// brokenRTRQP is an RC QP whose move to RTR fails as an illegal
// transition, as a QP errored behind the CM's back would.
type brokenRTRQP struct{ hca.QP }

func (q brokenRTRQP) Modify(attr hca.QPAttr) error {
	if attr.State == hca.QPStateRTR {
		return fmt.Errorf("test QP to RTR: %w", hca.ErrIllegalTransition)
	}
	return q.QP.Modify(attr)
}

// TestPeerTimeoutsBounded: a REQ asking for the largest timeouts (code 31:
// a REP resend every 2^23 ms, a time-wait of days) gets our bound of code
// 24 instead, about 65 s, for the REP resend and the passive QP's ACK
// timeout.
func TestPeerTimeoutsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		opts := testOptions(2)
		opts.MaxRetries = 1
		b := newNode(t, f, "b", opts)
		acc := newAcceptor(b)
		qp := &attrQP{QP: b.rcQP(), attrs: make(map[hca.QPState]hca.QPAttr)}
		acc.decide = func(r *Request) Decision {
			d := acc.decision(r)
			d.QP = qp
			return d
		}
		if _, err := b.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		raw := newRawGSI(t, f)
		req := goldenREQ()
		req.ServiceID, req.LocalCMResponseTimeout, req.Primary.LocalACKTimeout = ietfSID, 31, 31
		buf := make([]byte, MADSize)
		if err := req.Marshal(buf); err != nil {
			t.Fatal(err)
		}
		raw.send(b.dev.GID(), buf)
		bound := convertToMS(maxPeerTimeout)
		settle(bound - time.Millisecond)
		if n := b.m.Stats().Sent[MsgREP]; n != 1 {
			t.Fatalf("%d REPs before the bounded resend interval", n)
		}
		settle(2 * time.Millisecond)
		if n := b.m.Stats().Sent[MsgREP]; n != 2 {
			t.Fatalf("%d REPs after %v, want the resend", n, bound)
		}
		if to := qp.attr(hca.QPStateRTS).Timeout; to != maxPeerTimeout {
			t.Fatalf("passive QP ACK timeout %d, want the bound %d", to, maxPeerTimeout)
		}
		settle(bound + time.Millisecond)
		if got := acc.rec.types(acc.conns()[0]); !eq(got, []EventType{EventTimedOut}) {
			t.Fatalf("events %v", got)
		}
	})
}
