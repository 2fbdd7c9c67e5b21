package cm

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

const (
	ietfSID = 0x1000000000000049
	rfcSID  = 0x0100000000000049
)

// settle lets fake time pass and waits until every goroutine is idle.
func settle(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func TestEstablishDisconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a := newNode(t, f, "a", testOptions(1))
		b := newNode(t, f, "b", testOptions(2))
		acc := newAcceptor(b)
		l, err := b.m.Listen([]uint64{ietfSID, rfcSID}, acc.accept)
		if err != nil {
			t.Fatal(err)
		}
		if l.State() != StateListening {
			t.Fatalf("listener state %s", l.State())
		}
		rec := newRecorder()
		var passiveAtREP State
		var qpAtREP hca.QPState
		var c *Conn
		var aqp hca.QP
		rec.onREP = func(ev Event) {
			// The RTU has not left yet: the passive side still waits.
			passiveAtREP = acc.conns()[0].State()
			qpAtREP = aqp.State()
			if got := ev.Conn.State(); got != StateREPReceived {
				t.Errorf("state in REP handler %s", got)
			}
		}
		c, aqp = a.connect(b, ietfSID, rec.handle)
		if c.State() != StateREQSent {
			t.Fatalf("after Connect: %s", c.State())
		}
		synctest.Wait()

		if got := rec.types(c); !eq(got, []EventType{EventREPReceived, EventEstablished}) {
			t.Fatalf("active events %v", got)
		}
		if passiveAtREP != StateREPSent || qpAtREP != hca.QPStateRTS {
			t.Fatalf("at REP: passive %s, QP %s; want REP_SENT, RTS", passiveAtREP, qpAtREP)
		}
		pc := acc.conns()[0]
		if got := acc.rec.types(pc); !eq(got, []EventType{EventEstablished}) {
			t.Fatalf("passive events %v", got)
		}
		req := acc.reqs[0]
		if req.ServiceID != ietfSID || req.RemoteQPN != aqp.QPN() || req.PathMTU != hca.MTU2048 ||
			!req.SRQ || string(req.PrivateData[:8]) != string(ipoibPrivate(0x48)) || len(req.PrivateData) != 92 {
			t.Fatalf("request %+v", req)
		}
		if c.RemoteQPN() != acc.qps[pc].QPN() || pc.RemoteQPN() != aqp.QPN() {
			t.Fatalf("QPNs: active sees %d, passive sees %d", c.RemoteQPN(), pc.RemoteQPN())
		}
		if c.RemoteCommID() != pc.LocalCommID() || pc.RemoteCommID() != c.LocalCommID() {
			t.Fatal("comm IDs do not pair up")
		}
		if c.State() != StateEstablished || pc.State() != StateEstablished {
			t.Fatalf("states %s / %s", c.State(), pc.State())
		}
		// The QPs really are connected with matching PSNs: an RC send
		// from A lands in B's receive buffer.
		sendRC(t, a, b, aqp, acc.qps[pc])

		if err := c.Disconnect(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if c.State() != StateTimeWait || pc.State() != StateTimeWait {
			t.Fatalf("after DREQ/DREP: %s / %s", c.State(), pc.State())
		}
		settle(20 * time.Millisecond)
		if got := rec.types(c); !eq(got, []EventType{EventREPReceived, EventEstablished, EventDisconnected, EventTimeWaitExit}) {
			t.Fatalf("active events %v", got)
		}
		if got := acc.rec.types(pc); !eq(got, []EventType{EventEstablished, EventDisconnectRequested, EventTimeWaitExit}) {
			t.Fatalf("passive events %v", got)
		}
		sa, sb := a.m.Stats(), b.m.Stats()
		for typ, n := range map[MsgType]uint64{MsgREQ: 1, MsgRTU: 1, MsgDREQ: 1} {
			if sa.Sent[typ] != n || sb.Received[typ] != n {
				t.Errorf("%s: sent %d received %d, want %d", typ, sa.Sent[typ], sb.Received[typ], n)
			}
		}
		for typ, n := range map[MsgType]uint64{MsgREP: 1, MsgDREP: 1} {
			if sb.Sent[typ] != n || sa.Received[typ] != n {
				t.Errorf("%s: sent %d received %d, want %d", typ, sb.Sent[typ], sa.Received[typ], n)
			}
		}
		if sa.LiveConns != 0 || sb.LiveConns != 0 || sa.Retries != 0 || sb.Listeners != 2 {
			t.Fatalf("stats a %+v b %+v", sa, sb)
		}

		// The RFC's service ID form reaches the same listener.
		c2, _ := a.connect(b, rfcSID, rec.handle)
		synctest.Wait()
		if c2.State() != StateEstablished || acc.reqs[1].ServiceID != rfcSID {
			t.Fatalf("RFC service ID: %s", c2.State())
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if l.State() != StateIdle || b.m.Stats().Listeners != 0 {
			t.Fatal("listener still registered")
		}
	})
}

// sendRC posts one RC send on sq and checks it arrives on rq.
func sendRC(t *testing.T, a, b *node, sq, rq hca.QP) {
	t.Helper()
	rbuf, _ := b.dev.Alloc(64)
	sbuf, _ := a.dev.Alloc(64)
	copy(sbuf, "hello over RC")
	if _, err := rq.PostRecv([]hca.RecvWR{{ID: 7, Buf: rbuf}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sq.PostSend([]hca.SendWR{{ID: 8, Data: sbuf[:13]}}); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	wcs := make([]hca.WC, 4)
	n := b.cq.Poll(wcs)
	if n != 1 || wcs[0].Status != hca.StatusSuccess || string(rbuf[:wcs[0].ByteLen]) != "hello over RC" {
		t.Fatalf("RC receive: %d completions %+v", n, wcs[:n])
	}
	if n := a.cq.Poll(wcs); n != 1 || wcs[0].Status != hca.StatusSuccess {
		t.Fatalf("RC send completion: %+v", wcs[:n])
	}
}
