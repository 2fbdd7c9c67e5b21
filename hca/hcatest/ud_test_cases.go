package hcatest

import (
	"bytes"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

const testQKey hca.QKey = 0x0B1B

// testMGID is the IPoIB broadcast MGID of P_Key 0xFFFF.
var testMGID = hca.GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 10: 0, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xff}

func skipLossy(t *testing.T, f Fabric) {
	if f.Properties().LossyUD {
		t.Skip("backend configured to lose UD packets; this test needs every one")
	}
}

func createAH(t *testing.T, dev hca.Device, dgid hca.GID) hca.AH {
	t.Helper()
	ah, err := dev.CreateAH(dgid)
	if err != nil {
		t.Fatalf("create AH to %s: %v", dgid, err)
	}
	return ah
}

func testUDUnicast(t *testing.T, f Fabric) {
	skipLossy(t, f)
	da, db := f.NewDevice(t), f.NewDevice(t)
	a := newEndpoint(t, f, da, hca.QPTypeUD, qpOpts{ctx: "a"})
	b := newEndpoint(t, f, db, hca.QPTypeUD, qpOpts{ctx: "b"})
	udUp(t, a, testQKey, 0)
	udUp(t, b, testQKey, 0)
	buf := alloc(t, db, int(db.Port().ActiveMTU))
	postRecv(t, b.qp, hca.RecvWR{ID: 3, Buf: buf})
	msg := alloc(t, da, 1500)
	fill(msg, 3)
	ah := createAH(t, da, db.Port().GID)
	postSend(t, a.qp, hca.SendWR{ID: 4, Data: msg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey})
	expectWC(t, a.sendCQ.wait(t, 1)[0], 4, hca.StatusSuccess, hca.WCSend)
	wc := b.recvCQ.wait(t, 1)[0]
	expectWC(t, wc, 3, hca.StatusSuccess, hca.WCRecv)
	if wc.ByteLen != len(msg) || !bytes.Equal(buf[:len(msg)], msg) {
		t.Fatalf("UD payload differs (%d bytes)", wc.ByteLen)
	}
	if wc.SrcQPN != a.qp.QPN() || wc.SrcGID != da.Port().GID || wc.PKey != da.Port().PKeys[0] || wc.Context != "b" || wc.QPN != b.qp.QPN() {
		t.Fatalf("UD completion %+v: want src QPN %#x GID %s P_Key %#x", wc, a.qp.QPN(), da.Port().GID, da.Port().PKeys[0])
	}
	if err := ah.Destroy(); err != nil {
		t.Fatalf("destroy AH: %v", err)
	}
}

func testUDMulticast(t *testing.T, f Fabric) {
	skipLossy(t, f)
	devs := []hca.Device{f.NewDevice(t), f.NewDevice(t), f.NewDevice(t)}
	eps := make([]*endpoint, 3)
	bufs := make([][]byte, 3)
	for i, d := range devs {
		eps[i] = newEndpoint(t, f, d, hca.QPTypeUD, qpOpts{ctx: i})
		udUp(t, eps[i], testQKey, 0)
		bufs[i] = alloc(t, d, 2*1024)
		postRecv(t, eps[i].qp, hca.RecvWR{ID: 1, Buf: bufs[i][:1024]}, hca.RecvWR{ID: 2, Buf: bufs[i][1024:]})
	}
	for _, e := range eps[:2] {
		if err := e.qp.AttachMcast(testMGID); err != nil {
			t.Fatalf("attach: %v", err)
		}
	}
	if err := eps[0].qp.AttachMcast(hca.GID{0xfe, 0x80}); !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("attach to unicast GID: %v, want ErrInvalidArgument", err)
	}
	ah := createAH(t, devs[0], testMGID)
	msg := alloc(t, devs[0], 100)
	fill(msg, 9)
	send := func(id uint64) {
		postSend(t, eps[0].qp, hca.SendWR{ID: id, Data: msg, AH: ah, RemoteQPN: hca.QPNMulticast, RemoteQKey: testQKey})
		expectWC(t, eps[0].sendCQ.wait(t, 1)[0], id, hca.StatusSuccess, hca.WCSend)
	}
	send(10)
	for i, e := range eps[:2] {
		wc := e.recvCQ.wait(t, 1)[0]
		expectWC(t, wc, 1, hca.StatusSuccess, hca.WCRecv)
		if wc.SrcQPN != eps[0].qp.QPN() || wc.SrcGID != devs[0].Port().GID || wc.Context != i || !bytes.Equal(bufs[i][:100], msg) {
			t.Fatalf("member %d: multicast completion %+v", i, wc)
		}
	}
	if err := eps[1].qp.DetachMcast(testMGID); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if err := eps[1].qp.DetachMcast(testMGID); !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("second detach: %v, want ErrInvalidArgument", err)
	}
	send(11)
	expectWC(t, eps[0].recvCQ.wait(t, 1)[0], 2, hca.StatusSuccess, hca.WCRecv)
	// The sender's own echo has arrived, so the others' copies would have
	// too (the soft fabric delivers in member order; the suite accepts
	// nothing later as proof either way).
	for i := 1; i < 3; i++ {
		if got := eps[i].recvCQ.pollNow(); len(got) != 0 {
			t.Fatalf("non-member %d received %+v", i, got)
		}
	}
	if err := eps[0].qp.Destroy(); !isErr(err, hca.ErrBusy) {
		t.Fatalf("destroy of an attached QP: %v, want ErrBusy", err)
	}
	if err := eps[0].qp.DetachMcast(testMGID); err != nil {
		t.Fatalf("detach: %v", err)
	}
}

// testDropped sends a packet the receiver must drop, then one it must
// accept; exactly the second arrives.
func testDropped(t *testing.T, f Fabric, sender, good *endpoint, bad hca.SendWR, okWR hca.SendWR, r *endpoint) {
	t.Helper()
	buf := alloc(t, r.dev, 2*256)
	postRecv(t, r.qp, hca.RecvWR{ID: 1, Buf: buf[:256]}, hca.RecvWR{ID: 2, Buf: buf[256:]})
	postSend(t, sender.qp, bad)
	sender.sendCQ.wait(t, 1)
	postSend(t, good.qp, okWR)
	good.sendCQ.wait(t, 1)
	wc := r.recvCQ.wait(t, 1)[0]
	if wc.Status != hca.StatusSuccess || wc.ByteLen != len(okWR.Data) || wc.SrcQPN != good.qp.QPN() ||
		!bytes.Equal(buf[:len(okWR.Data)], okWR.Data) {
		t.Fatalf("received %+v; want only the good packet from QPN %#x", wc, good.qp.QPN())
	}
	if got := r.recvCQ.pollNow(); len(got) != 0 {
		t.Fatalf("extra receives %+v", got)
	}
}

func testQKeyMismatch(t *testing.T, f Fabric) {
	skipLossy(t, f)
	da, db := f.NewDevice(t), f.NewDevice(t)
	a := newEndpoint(t, f, da, hca.QPTypeUD, qpOpts{})
	b := newEndpoint(t, f, db, hca.QPTypeUD, qpOpts{})
	udUp(t, a, testQKey, 0)
	udUp(t, b, testQKey, 0)
	ah := createAH(t, da, db.Port().GID)
	badMsg, goodMsg := alloc(t, da, 10), alloc(t, da, 20)
	fill(goodMsg, 2)
	testDropped(t, f, a, a,
		hca.SendWR{ID: 1, Data: badMsg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey + 1},
		hca.SendWR{ID: 2, Data: goodMsg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey}, b)
}

func testPKeyMismatch(t *testing.T, f Fabric) {
	skipLossy(t, f)
	pf, ok := f.(PKeyFabric)
	if !ok {
		t.Skip("backend cannot make a device with a chosen P_Key table (PKeyFabric)")
	}
	da := pf.NewDeviceWithPKeys(t, []hca.PKey{0xFFFF, 0x8001})
	db := f.NewDevice(t)
	if pk := db.Port().PKeys[0]; pk&0x7FFF != 0x7FFF {
		t.Skipf("receiver's default P_Key is %#x, not the default partition", pk)
	}
	bad := newEndpoint(t, f, da, hca.QPTypeUD, qpOpts{})
	good := newEndpoint(t, f, da, hca.QPTypeUD, qpOpts{})
	b := newEndpoint(t, f, db, hca.QPTypeUD, qpOpts{})
	udUp(t, bad, testQKey, 1)
	udUp(t, good, testQKey, 0)
	udUp(t, b, testQKey, 0)
	ah := createAH(t, da, db.Port().GID)
	msg := alloc(t, da, 30)
	fill(msg, 5)
	testDropped(t, f, bad, good,
		hca.SendWR{ID: 1, Data: msg[:10], AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey},
		hca.SendWR{ID: 2, Data: msg, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey}, b)
}

func testGSI(t *testing.T, f Fabric) {
	da, db := f.NewDevice(t), f.NewDevice(t)
	a := newEndpoint(t, f, da, hca.QPTypeGSI, qpOpts{})
	if a.qp.QPN() != hca.QPNGSI {
		t.Fatalf("GSI QPN %#x, want 1", a.qp.QPN())
	}
	cq := newCQ(t, f, da, 4)
	if _, err := da.CreateQP(hca.QPConfig{Type: hca.QPTypeGSI, SendCQ: cq.CQ, RecvCQ: cq.CQ}); !isErr(err, hca.ErrBusy) {
		t.Fatalf("second GSI QP: %v, want ErrBusy", err)
	}
	b := newEndpoint(t, f, db, hca.QPTypeGSI, qpOpts{})
	if b.qp.QPN() != hca.QPNGSI {
		t.Fatalf("GSI QPN on second device %#x, want 1", b.qp.QPN())
	}
	if f.Properties().LossyUD {
		return
	}
	udUp(t, a, hca.QKeyGSI, 0)
	udUp(t, b, hca.QKeyGSI, 0)
	buf := alloc(t, db, 256)
	postRecv(t, b.qp, hca.RecvWR{ID: 1, Buf: buf})
	mad := alloc(t, da, 256)
	fill(mad, 1)
	postSend(t, a.qp, hca.SendWR{ID: 2, Data: mad, AH: createAH(t, da, db.Port().GID), RemoteQPN: hca.QPNGSI, RemoteQKey: hca.QKeyGSI})
	wc := b.recvCQ.wait(t, 1)[0]
	if wc.Status != hca.StatusSuccess || wc.SrcQPN != hca.QPNGSI || wc.ByteLen != 256 || !bytes.Equal(buf, mad) {
		t.Fatalf("GSI receive %+v", wc)
	}
	if err := a.qp.Destroy(); err != nil {
		t.Fatalf("destroy GSI QP: %v", err)
	}
	again := newEndpoint(t, f, da, hca.QPTypeGSI, qpOpts{})
	if again.qp.QPN() != hca.QPNGSI {
		t.Fatalf("recreated GSI QPN %#x", again.qp.QPN())
	}
}
