package soft

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// tcpMsg is an IPoIB/IPv4/TCP message with payload bytes of data.
func tcpMsg(payload int) []byte {
	m := make([]byte, hca.OffloadL3Offset+40+payload)
	binary.BigEndian.PutUint16(m, 0x0800)
	ip := m[hca.OffloadL3Offset:]
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], uint16(40+payload))
	ip[20+12] = 5 << 4
	return m
}

// TestNoOffloads: a fabric configured without offloads reports none and
// refuses checksum offload and LSO with ErrNotSupported, on UD and RC.
func TestNoOffloads(t *testing.T) {
	r := newRig(t, Config{NoOffloads: true}, rigOpts{})
	if o := r.da.Limits().Offloads; o != (hca.Offloads{}) {
		t.Fatalf("offloads %+v with NoOffloads", o)
	}
	if _, err := r.a.PostSend([]hca.SendWR{{ID: 1, Data: tcpMsg(10), Flags: hca.SendIPCsum}}); !errors.Is(err, hca.ErrNotSupported) {
		t.Fatalf("RC SendIPCsum without offload: %v", err)
	}
	ud, err := r.da.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: r.acq, RecvCQ: r.acq, MaxSendWR: 16, MaxRecvWR: 16})
	must(t, err)
	must(t, ud.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 1}))
	must(t, ud.Modify(hca.QPAttr{State: hca.QPStateRTR}))
	must(t, ud.Modify(hca.QPAttr{State: hca.QPStateRTS}))
	ah, err := r.da.CreateAH(r.db.Port().GID)
	must(t, err)
	for _, wr := range []hca.SendWR{
		{ID: 2, Data: tcpMsg(10), AH: ah, RemoteQPN: 2, RemoteQKey: 1, Flags: hca.SendIPCsum},
		{ID: 3, Data: tcpMsg(5000), AH: ah, RemoteQPN: 2, RemoteQKey: 1, MSS: 1000},
	} {
		if n, err := ud.PostSend([]hca.SendWR{wr}); n != 0 || !errors.Is(err, hca.ErrNotSupported) {
			t.Fatalf("UD WR %d without offload: %d, %v", wr.ID, n, err)
		}
	}
	if got := r.acq.Poll(make([]hca.WC, 4)); got != 0 {
		t.Fatalf("%d completions for refused sends", got)
	}
}

// TestLSOSegmentsCounted: an LSO send's datagrams count in UDMessages
// and UDLSOSegments.
func TestLSOSegmentsCounted(t *testing.T) {
	r := newRig(t, Config{}, rigOpts{})
	mk := func(d hca.Device, c *cq) hca.QP {
		q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c, RecvCQ: c, MaxSendWR: 16, MaxRecvWR: 16})
		must(t, err)
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 1}))
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTR}))
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTS}))
		return q
	}
	a, b := mk(r.da, r.acq), mk(r.db, r.bcq)
	for i := range 5 {
		_, err := b.PostRecv([]hca.RecvWR{{ID: uint64(i), Buf: make([]byte, 4096)}})
		must(t, err)
	}
	ah, err := r.da.CreateAH(r.db.Port().GID)
	must(t, err)
	before := r.f.Stats()
	if _, err := a.PostSend([]hca.SendWR{{ID: 9, Data: tcpMsg(5 * 1000), AH: ah, RemoteQPN: b.QPN(), RemoteQKey: 1, MSS: 1000}}); err != nil {
		t.Fatal(err)
	}
	wcs := r.waitCQ(t, r.bcq, 5)
	for _, wc := range wcs {
		if wc.Status != hca.StatusSuccess || wc.ByteLen != hca.OffloadL3Offset+40+1000 || wc.Flags != hca.WCCsumPartial {
			t.Fatalf("segment completion %+v", wc)
		}
	}
	after := r.f.Stats()
	if after.UDLSOSegments-before.UDLSOSegments != 5 || after.UDMessages-before.UDMessages != 5 {
		t.Fatalf("LSO segments %d, UD messages %d; want 5 and 5",
			after.UDLSOSegments-before.UDLSOSegments, after.UDMessages-before.UDMessages)
	}
}
