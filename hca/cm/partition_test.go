package cm

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// madTap records the P_Key and type of every MAD the fabric carries.
type madTap struct {
	mu   sync.Mutex
	mads []tappedMAD
}

type tappedMAD struct {
	src  string
	typ  MsgType
	pkey hca.PKey // the BTH's
	req  REQ      // when typ is MsgREQ
	rej  REJ      // when typ is MsgREJ
}

func (tp *madTap) Message(m *soft.Message) {
	if m.Kind != soft.MessageUD || m.DstQPN != hca.QPNGSI {
		return
	}
	h, err := ParseMADHeader(m.Data)
	if err != nil {
		return
	}
	e := tappedMAD{src: m.SrcDev, typ: MsgType(h.AttributeID), pkey: m.PKey}
	switch e.typ {
	case MsgREQ:
		if err := e.req.Unmarshal(m.Data); err != nil {
			return
		}
	case MsgREJ:
		if err := e.rej.Unmarshal(m.Data); err != nil {
			return
		}
	}
	tp.mu.Lock()
	tp.mads = append(tp.mads, e)
	tp.mu.Unlock()
}

func (tp *madTap) all() []tappedMAD {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]tappedMAD(nil), tp.mads...)
}

// lastREJ is the last REJ src sent.
func (tp *madTap) lastREJ(src string) (REJ, bool) {
	mads := tp.all()
	for i := len(mads) - 1; i >= 0; i-- {
		if mads[i].src == src && mads[i].typ == MsgREJ {
			return mads[i].rej, true
		}
	}
	return REJ{}, false
}

// partitionNodes makes nodes whose tables are set after their Managers
// started, so the Managers learn them from PKEY_CHANGE.
func partitionNodes(t *testing.T, tables ...[]hca.PKey) (*madTap, *soft.Fabric, []*node) {
	tp := &madTap{}
	f := soft.NewFabric(soft.Config{Seed: 1, MTU: hca.MTU4096, Tap: tp})
	t.Cleanup(func() { f.Close() })
	var nodes []*node
	for k, table := range tables {
		n := newNode(t, f, string(rune('a'+k)), testOptions(int64(k+1)))
		if err := n.dev.SetPKeyTable(table); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	synctest.Wait()
	return tp, f, nodes
}

// rcQPIn is an RC QP in Init on P_Key index index.
func (n *node) rcQPIn(index int) hca.QP {
	n.t.Helper()
	qp, err := n.dev.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		n.t.Fatal(err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: index}); err != nil {
		n.t.Fatal(err)
	}
	return qp
}

// partitionAcceptor accepts with a QP on the index the Request names.
func partitionAcceptor(n *node) *acceptor {
	acc := newAcceptor(n)
	acc.decide = func(req *Request) Decision {
		qp := n.rcQPIn(req.PKeyIndex)
		acc.mu.Lock()
		acc.qps[req.Conn] = qp
		acc.mu.Unlock()
		return Decision{QP: qp, StartingPSN: 1, PrivateData: ipoibPrivate(0x49), SRQ: true, Handler: acc.rec.handle}
	}
	return acc
}

func connectIn(t *testing.T, a, b *node, pkey hca.PKey, index int, rec *recorder) *Conn {
	t.Helper()
	c, err := a.m.Connect(ConnectParams{
		DestGID: b.dev.GID(), ServiceID: ietfSID, QP: a.rcQPIn(index), PathMTU: hca.MTU2048,
		PrivateData: ipoibPrivate(0x48), SRQ: true, PKey: pkey,
	}, rec.handle)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConnectInPartition: a connection in 0x8001 carries the partition in
// the REQ (IBTA 12.6.5), sends every MAD of the handshake with it in the
// BTH, and the passive side learns the index its QP must use; the RC QPs
// then carry data.
func TestConnectInPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, _, ns := partitionNodes(t, []hca.PKey{0xFFFF, 0x8001}, []hca.PKey{0xFFFF, 0x8002, 0x8001})
		a, b := ns[0], ns[1]
		acc := partitionAcceptor(b)
		if _, err := b.m.ListenPKey(0x8001, []uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		c := connectIn(t, a, b, 0x8001, 1, rec)
		synctest.Wait()
		if c.State() != StateEstablished || c.PKey() != 0x8001 {
			t.Fatalf("active connection %s in P_Key %#04x", c.State(), c.PKey())
		}
		if len(acc.reqs) != 1 || acc.reqs[0].PKey != 0x8001 || acc.reqs[0].PKeyIndex != 2 {
			t.Fatalf("requests %+v; want one of P_Key 0x8001 at index 2", acc.reqs)
		}
		var types []MsgType
		for _, m := range tp.all() {
			types = append(types, m.typ)
			if m.pkey != 0x8001 {
				t.Errorf("%s from %s with BTH P_Key %#04x, want 0x8001", m.typ, m.src, m.pkey)
			}
			if m.typ == MsgREQ && m.req.PKey != 0x8001 {
				t.Errorf("REQ Partition Key %#04x, want 0x8001", m.req.PKey)
			}
		}
		if !eq(types, []MsgType{MsgREQ, MsgREP, MsgRTU}) {
			t.Fatalf("MADs %v", types)
		}
	})
}

// TestConnectLimitedMember: the REQ carries the membership the port's
// table gives (a limited 0x0001), which a full member accepts.
func TestConnectLimitedMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, _, ns := partitionNodes(t, []hca.PKey{0xFFFF, 0x0001}, []hca.PKey{0xFFFF, 0x8001})
		a, b := ns[0], ns[1]
		acc := partitionAcceptor(b)
		if _, err := b.m.ListenPKey(0x8001, []uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		c := connectIn(t, a, b, 0x8001, 1, newRecorder())
		synctest.Wait()
		if c.State() != StateEstablished || c.PKey() != 0x0001 {
			t.Fatalf("connection %s in P_Key %#04x; want established in 0x0001", c.State(), c.PKey())
		}
		if m := tp.all()[0]; m.typ != MsgREQ || m.req.PKey != 0x0001 || m.pkey != 0x0001 {
			t.Fatalf("first MAD %+v; want the REQ of 0x0001", m)
		}
	})
}

// TestConnectPartitionNotInTable: Connect refuses a partition the port
// is not in.
func TestConnectPartitionNotInTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, ns := partitionNodes(t, []hca.PKey{0xFFFF}, []hca.PKey{0xFFFF})
		_, err := ns[0].m.Connect(ConnectParams{DestGID: ns[1].dev.GID(), ServiceID: ietfSID, QP: ns[0].rcQP(),
			PathMTU: hca.MTU2048, PKey: 0x8001}, newRecorder().handle)
		if !errors.Is(err, hca.ErrInvalidArgument) {
			t.Fatalf("connect in 0x8001 without it in the table: %v", err)
		}
	})
}

// TestREQPartitionChecks: the passive side refuses a REQ whose partition
// its table cannot match (REJ INVALID_GID with its GID as ARI, as Linux's
// cm_req_handler) and one of another partition than the listener's (REJ
// INVALID_SERVICE_ID); each REJ goes out in the partition the REQ's MAD
// came in. The REQs come from a raw GSI QP on the default partition, as a peer
// whose MADs and REQ disagree would send them.
func TestREQPartitionChecks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, f, ns := partitionNodes(t, []hca.PKey{0xFFFF, 0x8001, 0x0003})
		b := ns[0]
		acc := partitionAcceptor(b)
		if _, err := b.m.ListenPKey(0x8001, []uint64{ietfSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		if _, err := b.m.Listen([]uint64{rfcSID}, acc.accept); err != nil {
			t.Fatal(err)
		}
		if _, err := b.m.ListenPKey(0x8000, []uint64{rfcSID + 1}, acc.accept); !errors.Is(err, hca.ErrInvalidArgument) {
			t.Fatalf("listen in the invalid partition: %v", err)
		}
		raw := newRawGSI(t, f)
		for k, c := range []struct {
			sid    uint64
			pkey   hca.PKey
			reason RejectReason
		}{
			{ietfSID, 0x8002, RejectInvalidGID},       // no such partition here
			{ietfSID, 0x0003, RejectInvalidGID},       // two limited members
			{ietfSID, 0x8000, RejectInvalidGID},       // the invalid P_Key
			{ietfSID, 0xFFFF, RejectInvalidServiceID}, // the listener serves 0x8001 only
			{rfcSID, 0x8003, 0},                       // any partition: accepted
		} {
			req := goldenREQ()
			req.LocalCommID, req.TransactionID = uint32(100+k), uint64(100+k)
			req.ServiceID, req.PKey = c.sid, c.pkey
			req.Primary.LocalGID = raw.dev.GID()
			buf := make([]byte, MADSize)
			if err := req.Marshal(buf); err != nil {
				t.Fatal(err)
			}
			raw.send(b.dev.GID(), buf)
			synctest.Wait()
			rej, ok := tp.lastREJ(b.dev.Name())
			switch {
			case c.reason == 0 && ok && rej.RemoteCommID == req.LocalCommID:
				t.Errorf("REQ of %#04x to %#x: REJ %s, want a REP", c.pkey, c.sid, rej.Reason)
			case c.reason != 0 && (!ok || rej.Reason != c.reason || rej.RemoteCommID != req.LocalCommID):
				t.Errorf("REQ of %#04x to %#x: REJ %+v (%v), want %s", c.pkey, c.sid, rej, ok, c.reason)
			case c.reason == RejectInvalidGID && (rej.RejectInfoLength != 16 || hca.GID(rej.ARI[:16]) != b.dev.GID()):
				t.Errorf("REJ INVALID_GID ARI %d bytes %x, want our GID", rej.RejectInfoLength, rej.ARI[:16])
			}
		}
		s := b.m.Stats()
		if s.REQs[REQBadPKey] != 3 || s.REQs[REQWrongPartition] != 1 || s.REQs[REQToListener] != 1 {
			t.Fatalf("REQ outcomes %v", s.REQs)
		}
		if len(acc.reqs) != 1 || acc.reqs[0].PKey != 0x8003 {
			t.Fatalf("listener saw %+v", acc.reqs)
		}
		// A refused REQ is answered in the partition its MAD came in; the
		// accepted one's REP goes in the REQ's partition, as the
		// connection's MADs do (cm_init_av_by_path).
		for _, m := range tp.all() {
			want := hca.PKey(0xFFFF)
			if m.typ == MsgREP {
				want = 0x0003
			}
			if m.src == b.dev.Name() && m.pkey != want {
				t.Errorf("%s answered with BTH P_Key %#04x, want %#04x", m.typ, m.pkey, want)
			}
		}
	})
}
