package hcatest

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// PKeyTableFabric is implemented by backends whose P_Key table can be
// rewritten at run time (the subnet manager's job); the PKEY_CHANGE test
// needs it.
type PKeyTableFabric interface {
	SetPKeyTable(t *testing.T, dev hca.Device, table []hca.PKey)
}

// partitionHost is a device whose table is {0xFFFF, member}, a UD QP on
// each of the two indices, a fence QP and a GSI QP, all in RTS.
type partitionHost struct {
	dev   hca.Device
	deflt *endpoint // index 0: 0xFFFF
	part  *endpoint // index 1: the partition under test
	fence *endpoint // index 0, never a test's target
	gsi   *endpoint
}

func newPartitionHost(t *testing.T, f Fabric, pf PKeyFabric, member hca.PKey) *partitionHost {
	t.Helper()
	h := &partitionHost{dev: pf.NewDeviceWithPKeys(t, []hca.PKey{hca.PKeyDefault, member})}
	h.deflt = newEndpoint(t, f, h.dev, hca.QPTypeUD, qpOpts{})
	h.part = newEndpoint(t, f, h.dev, hca.QPTypeUD, qpOpts{})
	h.fence = newEndpoint(t, f, h.dev, hca.QPTypeUD, qpOpts{})
	h.gsi = newEndpoint(t, f, h.dev, hca.QPTypeGSI, qpOpts{})
	udUp(t, h.fence, testQKey, 0)
	udUp(t, h.deflt, testQKey, 0)
	udUp(t, h.part, testQKey, 1)
	udUp(t, h.gsi, hca.QKeyGSI, 0)
	return h
}

func partitionFabric(t *testing.T, f Fabric) PKeyFabric {
	t.Helper()
	skipLossy(t, f)
	pf, ok := f.(PKeyFabric)
	if !ok {
		t.Skip("backend cannot make a device with a chosen P_Key table (PKeyFabric)")
	}
	return pf
}

// sendAndFence sends wr from s to r, then a fence between the two hosts'
// fence QPs, and waits for the fence: by then the receiver has judged wr
// (one receive path per port). It returns what r received (nil if
// nothing) and how many P_Key violations r's port counted meanwhile. With
// expect it waits for r's completion, which a backend may deliver later
// than the fence's on another CQ.
func sendAndFence(t *testing.T, sh, rh *partitionHost, s, r *endpoint, wr hca.SendWR, expect bool) (*hca.WC, uint64) {
	t.Helper()
	before := rh.dev.Port().PKeyViolations
	postRecv(t, r.qp, hca.RecvWR{ID: 11, Buf: alloc(t, rh.dev, 256)})
	postRecv(t, rh.fence.qp, hca.RecvWR{ID: 12, Buf: alloc(t, rh.dev, 256)})
	postSend(t, s.qp, wr)
	s.sendCQ.wait(t, 1)
	postSend(t, sh.fence.qp, hca.SendWR{ID: 13, Data: alloc(t, sh.dev, 16), AH: createAH(t, sh.dev, rh.dev.Port().GID),
		RemoteQPN: rh.fence.qp.QPN(), RemoteQKey: testQKey})
	sh.fence.sendCQ.wait(t, 1)
	rh.fence.recvCQ.wait(t, 1)
	var wcs []hca.WC
	if expect {
		wcs = r.recvCQ.wait(t, 1)
	} else {
		wcs = r.recvCQ.pollNow()
	}
	var got *hca.WC
	if len(wcs) > 0 {
		got = &wcs[0]
	}
	return got, rh.dev.Port().PKeyViolations - before
}

// testPKeyMembership checks IBTA 10.9.3 on UD: same partition passes, a
// partition the receiver is not in is dropped at its port, two limited
// members cannot talk, a limited and a full member can, a QP of the
// default partition does not receive a partition's packets; every drop is
// one P_Key violation at the receiving port and delivered packets carry
// the sender's P_Key in the completion.
func testPKeyMembership(t *testing.T, f Fabric) {
	pf := partitionFabric(t, f)
	full1 := newPartitionHost(t, f, pf, 0x8001)
	full2 := newPartitionHost(t, f, pf, 0x8001)
	lim1 := newPartitionHost(t, f, pf, 0x0001)
	lim2 := newPartitionHost(t, f, pf, 0x0001)
	other := newPartitionHost(t, f, pf, 0x8002)
	for _, c := range []struct {
		name    string
		sh, rh  *partitionHost
		s, r    *endpoint
		deliver bool
		pkey    hca.PKey
	}{
		{"full to full", full1, full2, full1.part, full2.part, true, 0x8001},
		{"limited to full", lim1, full2, lim1.part, full2.part, true, 0x0001},
		{"full to limited", full1, lim1, full1.part, lim1.part, true, 0x8001},
		{"limited to limited", lim1, lim2, lim1.part, lim2.part, false, 0x0001},
		{"other partition", other, full1, other.part, full1.part, false, 0x8002},
		{"partition to default QP", full1, full2, full1.part, full2.deflt, false, 0x8001},
		{"default to partition QP", full1, full2, full1.deflt, full2.part, false, 0xFFFF},
	} {
		msg := alloc(t, c.sh.dev, 40)
		fill(msg, 9)
		wr := hca.SendWR{ID: 10, Data: msg, AH: createAH(t, c.sh.dev, c.rh.dev.Port().GID), RemoteQPN: c.r.qp.QPN(), RemoteQKey: testQKey}
		got, violations := sendAndFence(t, c.sh, c.rh, c.s, c.r, wr, c.deliver)
		switch {
		case c.deliver && (got == nil || got.Status != hca.StatusSuccess || got.PKey != c.pkey || violations != 0):
			t.Errorf("%s: received %+v with %d P_Key violations; want delivery with P_Key %#04x and none", c.name, got, violations, c.pkey)
		case !c.deliver && (got != nil || violations != 1):
			t.Errorf("%s: received %+v with %d P_Key violations; want a drop counted once", c.name, got, violations)
		}
	}
}

// testPKeyRC checks the partition rule on RC: requests of a QP whose
// P_Key the responder's does not match are dropped (counted at the
// responder) and the requester runs out of retries; a limited member
// reaches a full one.
func testPKeyRC(t *testing.T, f Fabric) {
	pf := partitionFabric(t, f)
	for _, c := range []struct {
		name   string
		ta, tb []hca.PKey
		ok     bool
	}{
		{"same partition", []hca.PKey{0xFFFF, 0x8001}, []hca.PKey{0xFFFF, 0x8001}, true},
		{"limited and full", []hca.PKey{0xFFFF, 0x0001}, []hca.PKey{0xFFFF, 0x8001}, true},
		{"two limited", []hca.PKey{0xFFFF, 0x0001}, []hca.PKey{0xFFFF, 0x0001}, false},
		{"other partition", []hca.PKey{0xFFFF, 0x8002}, []hca.PKey{0xFFFF, 0x8001}, false},
	} {
		da, db := pf.NewDeviceWithPKeys(t, c.ta), pf.NewDeviceWithPKeys(t, c.tb)
		o := qpOpts{pkeyIndex: 1}
		a := newEndpoint(t, f, da, hca.QPTypeRC, o)
		b := newEndpoint(t, f, db, hca.QPTypeRC, o)
		connect(t, a, b, o, o)
		buf := alloc(t, db, 64)
		postRecv(t, b.qp, hca.RecvWR{ID: 1, Buf: buf})
		before := db.Port().PKeyViolations
		postSend(t, a.qp, hca.SendWR{ID: 2, Data: alloc(t, da, 32)})
		wc := a.sendCQ.wait(t, 1)[0]
		violations := db.Port().PKeyViolations - before
		if c.ok {
			if wc.Status != hca.StatusSuccess || violations != 0 {
				t.Errorf("%s: send %s with %d violations; want success and none", c.name, wc.Status, violations)
			}
			if r := b.recvCQ.wait(t, 1)[0]; r.Status != hca.StatusSuccess || r.ByteLen != 32 {
				t.Errorf("%s: receive %+v", c.name, r)
			}
			continue
		}
		if wc.Status != hca.StatusRetryExcErr || violations == 0 {
			t.Errorf("%s: send %s with %d violations at the responder; want RETRY_EXC_ERR and at least one", c.name, wc.Status, violations)
		}
		if got := b.recvCQ.pollNow(); len(got) != 0 {
			t.Errorf("%s: responder received %+v", c.name, got)
		}
	}
}

// testGSIPKeys checks QP 1: it sends each MAD with the P_Key of the work
// request's index, receives every P_Key its port's table matches (the
// completion says which), and the port drops MADs of partitions it is
// not in. A P_Key index outside the table fails the post.
func testGSIPKeys(t *testing.T, f Fabric) {
	pf := partitionFabric(t, f)
	a := newPartitionHost(t, f, pf, 0x8001)
	b := newPartitionHost(t, f, pf, 0x8001)
	c := newPartitionHost(t, f, pf, 0x8002)
	mad := alloc(t, a.dev, 256)
	fill(mad, 3)
	wr := func(dst *partitionHost, index int) hca.SendWR {
		return hca.SendWR{ID: 20, Data: mad, AH: createAH(t, a.dev, dst.dev.Port().GID),
			RemoteQPN: hca.QPNGSI, RemoteQKey: hca.QKeyGSI, PKeyIndex: index}
	}
	for _, index := range []int{0, 1} {
		got, violations := sendAndFence(t, a, b, a.gsi, b.gsi, wr(b, index), true)
		want := []hca.PKey{0xFFFF, 0x8001}[index]
		if got == nil || got.Status != hca.StatusSuccess || got.PKey != want || got.SrcQPN != hca.QPNGSI || violations != 0 {
			t.Errorf("GSI send with P_Key index %d: received %+v, %d violations; want P_Key %#04x", index, got, violations, want)
		}
	}
	if got, violations := sendAndFence(t, a, c, a.gsi, c.gsi, wr(c, 1), false); got != nil || violations != 1 {
		t.Errorf("GSI MAD of 0x8001 to a port without it: received %+v, %d violations; want a drop counted once", got, violations)
	}
	for _, index := range []int{-1, 2} {
		if n, err := a.gsi.qp.PostSend([]hca.SendWR{wr(b, index)}); n != 0 || !isErr(err, hca.ErrInvalidArgument) {
			t.Errorf("GSI send with P_Key index %d of 2: %d posted, %v; want ErrInvalidArgument", index, n, err)
		}
	}
	cq := newCQ(t, f, a.dev, 4)
	qp, err := a.dev.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: cq.CQ, RecvCQ: cq.CQ})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Destroy() })
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit, PKeyIndex: 2, QKey: testQKey}); !isErr(err, hca.ErrInvalidArgument) {
		t.Errorf("Init with P_Key index 2 of 2: %v; want ErrInvalidArgument", err)
	}
}

// testPKeyChange checks the subnet manager's rewrite of a table: the port
// raises PKEY_CHANGE, reports the new table, and a QP keeps its index and
// sends with the value now there.
func testPKeyChange(t *testing.T, f Fabric) {
	pf := partitionFabric(t, f)
	tf, ok := f.(PKeyTableFabric)
	if !ok {
		t.Skip("backend's P_Key table is fixed (PKeyTableFabric)")
	}
	a := newPartitionHost(t, f, pf, 0x8001)
	b := newPartitionHost(t, f, pf, 0x8003)
	events := make(chan hca.AsyncEvent, 4)
	cancel := a.dev.OnPortEvent(func(ev hca.AsyncEvent) { events <- ev })
	defer cancel()
	tf.SetPKeyTable(t, a.dev, []hca.PKey{0xFFFF, 0x8003})
	select {
	case ev := <-events:
		if ev.Type != hca.EventPortPKeyChange {
			t.Fatalf("event %s, want PKEY_CHANGE", ev.Type)
		}
	case <-time.After(timeout(f)):
		t.Fatal("no PKEY_CHANGE after the table changed")
	}
	if p := a.dev.Port(); len(p.PKeys) != 2 || p.PKeys[1] != 0x8003 {
		t.Fatalf("table %#04x after the change", p.PKeys)
	}
	msg := alloc(t, a.dev, 24)
	got, violations := sendAndFence(t, a, b, a.part, b.part, hca.SendWR{ID: 30, Data: msg,
		AH: createAH(t, a.dev, b.dev.Port().GID), RemoteQPN: b.part.qp.QPN(), RemoteQKey: testQKey}, true)
	if got == nil || got.PKey != 0x8003 || violations != 0 {
		t.Errorf("QP on index 1 after the change: received %+v, %d violations; want P_Key 0x8003", got, violations)
	}
}
