package soft

import (
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// TestMcastStatsCountOnlyAttached: the fabric delivers a group's messages
// to attached QPs only, and the device's per-group count stops moving at
// DetachMcast.
func TestMcastStatsCountOnlyAttached(t *testing.T) {
	f := NewFabric(Config{Seed: 1})
	defer f.Close()
	mgid := hca.GID{0xff, 0x12, 0x40, 0x1b, 15: 9}
	udQP := func(d *Device) hca.QP {
		c, err := d.CreateCQ(hca.CQConfig{Size: 64})
		must(t, err)
		q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c, RecvCQ: c})
		must(t, err)
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 7}))
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTR}))
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTS}))
		for k := range 8 {
			_, err = q.PostRecv([]hca.RecvWR{{ID: uint64(k), Buf: make([]byte, 64)}})
			must(t, err)
		}
		return q
	}
	rd, err := f.NewDevice("member")
	must(t, err)
	sd, err := f.NewDevice("sender")
	must(t, err)
	rq, sq := udQP(rd), udQP(sd)
	ah, err := sd.CreateAH(mgid)
	must(t, err)
	send := func() {
		t.Helper()
		_, err := sq.PostSend([]hca.SendWR{{ID: 1, Data: []byte("grp"), AH: ah, RemoteQPN: hca.QPNMulticast, RemoteQKey: 7}})
		must(t, err)
	}
	send() // nobody attached: dropped as no QP
	if st := rd.McastStats(); len(st.Delivered) != 0 || len(st.Attached) != 0 {
		t.Fatalf("before attach: %+v", st)
	}
	must(t, rq.AttachMcast(mgid))
	send()
	send()
	st := rd.McastStats()
	if !slices.Equal(st.Attached, []string{mgid.String()}) || st.Delivered[mgid.String()] != 2 {
		t.Fatalf("attached: %+v, want 2 delivered to %s", st, mgid)
	}
	must(t, rq.DetachMcast(mgid))
	drops := f.Stats().UDDrops.NoQP
	send()
	st = rd.McastStats()
	if len(st.Attached) != 0 || st.Delivered[mgid.String()] != 2 {
		t.Fatalf("after detach: %+v, want the count stopped at 2", st)
	}
	if got := f.Stats().UDDrops.NoQP; got != drops+1 {
		t.Fatalf("send to a group without members: no-QP drops %d, want %d", got, drops+1)
	}
	if sd.McastStats().Delivered[mgid.String()] != 0 {
		t.Fatal("the sender, never attached, was counted")
	}
}
