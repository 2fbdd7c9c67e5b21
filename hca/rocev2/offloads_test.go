package rocev2

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
)

// TestNoOffloadsReportsNothing: a device configured without offloads
// reports none, refuses SendIPCsum and LSO, and never flags a receive
// WCIPCsumOK, even for a datagram whose checksums are valid.
func TestNoOffloadsReportsNothing(t *testing.T) {
	f := newTestFabric(t, 61, Faults{})
	cfg := f.config(t)
	cfg.NoOffloads = true
	da, db := f.newDevice(t), f.open(t, cfg)
	if o := db.Limits().Offloads; o != (hca.Offloads{}) {
		t.Fatalf("offloads %+v with NoOffloads", o)
	}
	if o := da.Limits().Offloads; o != hca.ConnectXOffloads() {
		t.Fatalf("default offloads %+v", o)
	}
	mk := func(d *Device) (hca.QP, *waitCQ) {
		c := newWaitCQ(t, d, 64)
		q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c.CQ, RecvCQ: c.CQ, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []hca.QPState{hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS} {
			mustModify(t, q, hca.QPAttr{State: s, QKey: 5})
		}
		return q, c
	}
	qa, ca := mk(da)
	qb, cb := mk(db)
	msg := make([]byte, hca.OffloadL3Offset+40+500)
	binary.BigEndian.PutUint16(msg, 0x0800)
	ip := msg[hca.OffloadL3Offset:]
	ip[0], ip[8], ip[9] = 0x45, 64, offload.ProtoTCP
	binary.BigEndian.PutUint16(ip[2:], 40+500)
	ip[32] = 5 << 4
	if _, err := offload.FillChecksums(msg, hca.OffloadL3Offset); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := qb.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}}); err != nil {
		t.Fatal(err)
	}
	ahB, err := da.CreateAH(db.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostSend([]hca.SendWR{{ID: 2, Data: msg, AH: ahB, RemoteQPN: qb.QPN(), RemoteQKey: 5}}); err != nil {
		t.Fatal(err)
	}
	ca.wait(t, 1)
	if wc := cb.wait(t, 1)[0]; wc.Status != hca.StatusSuccess || wc.Flags != 0 {
		t.Fatalf("receive on a device without offloads: %+v", wc)
	}
	ahA, err := db.CreateAH(da.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	for _, wr := range []hca.SendWR{
		{ID: 3, Data: msg, AH: ahA, RemoteQPN: qa.QPN(), RemoteQKey: 5, Flags: hca.SendIPCsum},
		{ID: 4, Data: msg, AH: ahA, RemoteQPN: qa.QPN(), RemoteQKey: 5, MSS: 100},
	} {
		if n, err := qb.PostSend([]hca.SendWR{wr}); n != 0 || !errors.Is(err, hca.ErrNotSupported) {
			t.Fatalf("WR %d on a device without offloads: %d, %v", wr.ID, n, err)
		}
	}
}
