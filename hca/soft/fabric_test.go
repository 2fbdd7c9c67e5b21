package soft

import (
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

func TestDeviceAddressing(t *testing.T) {
	f := NewFabric(Config{PKey: 0x8001})
	defer f.Close()
	d1, err := f.NewDevice("x")
	must(t, err)
	d2, err := f.NewDevice("y")
	must(t, err)
	if _, err := f.NewDevice("x"); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("duplicate name: %v", err)
	}
	if got := d1.Port().GID.String(); got != "fe80::1" {
		t.Errorf("first GID %s, want fe80::1", got)
	}
	if got := d2.Port().GID.String(); got != "fe80::2" {
		t.Errorf("second GID %s, want fe80::2", got)
	}
	p := d1.Port()
	if !slices.Equal(p.PKeys, []hca.PKey{0x8001}) || p.ActiveMTU != hca.MTU4096 || !p.Active {
		t.Errorf("port %+v", p)
	}
	if d1.Limits().MaxMsgSize < 65536 {
		t.Errorf("MaxMsgSize %d", d1.Limits().MaxMsgSize)
	}
}

func TestDestroyedQPOpsCounted(t *testing.T) {
	r := newRig(t, Config{}, rigOpts{})
	must(t, r.b.Destroy())
	calls := []error{
		func() error { _, err := r.b.PostSend([]hca.SendWR{{ID: 1}}); return err }(),
		func() error { _, err := r.b.PostRecv([]hca.RecvWR{{ID: 1}}); return err }(),
		r.b.Modify(hca.QPAttr{State: hca.QPStateError}),
		r.b.AttachMcast(hca.GID{0xff}),
		r.b.DetachMcast(hca.GID{0xff}),
		r.b.Destroy(),
	}
	for i, err := range calls {
		if !errors.Is(err, hca.ErrDestroyed) {
			t.Errorf("call %d: %v, want ErrDestroyed", i, err)
		}
	}
	if got := r.f.Stats().DestroyedQPOps; got != uint64(len(calls)) {
		t.Fatalf("DestroyedQPOps %d, want %d", got, len(calls))
	}
}

func TestUDDropReasons(t *testing.T) {
	f := NewFabric(Config{MTU: hca.MTU1024})
	defer f.Close()
	da, _ := f.NewDevice("a")
	db, _ := f.NewDevice("b")
	must(t, da.SetPKeyTable([]hca.PKey{0xFFFF, 0x8002}))
	mk := func(d *Device, pkeyIndex int, posts int) (*qp, *cq) {
		c, _ := d.CreateCQ(hca.CQConfig{Size: 64})
		q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c, RecvCQ: c})
		must(t, err)
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 7, PKeyIndex: pkeyIndex}))
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTR}))
		must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTS}))
		for range posts {
			_, err := q.PostRecv([]hca.RecvWR{{Buf: make([]byte, 2048)}})
			must(t, err)
		}
		return q.(*qp), c.(*cq)
	}
	s, _ := mk(da, 0, 0)
	sBadPKey, _ := mk(da, 1, 0)
	r, rcq := mk(db, 0, 1)
	empty, _ := mk(db, 0, 0)
	ah, _ := da.CreateAH(db.gid)
	send := func(q *qp, wr hca.SendWR) {
		t.Helper()
		wr.AH = ah
		if _, err := q.PostSend([]hca.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
	}
	small := make([]byte, 100)
	send(s, hca.SendWR{Data: small, RemoteQPN: r.qpn, RemoteQKey: 8})        // qkey
	send(sBadPKey, hca.SendWR{Data: small, RemoteQPN: r.qpn, RemoteQKey: 7}) // pkey
	send(s, hca.SendWR{Data: small, RemoteQPN: 0x777, RemoteQKey: 7})        // no QP
	send(s, hca.SendWR{Data: small, RemoteQPN: empty.qpn, RemoteQKey: 7})    // no buffer
	send(s, hca.SendWR{Data: make([]byte, 1025), RemoteQPN: r.qpn, RemoteQKey: 7})
	db.SetLinkUp(false)
	send(s, hca.SendWR{Data: small, RemoteQPN: r.qpn, RemoteQKey: 7}) // receiver link down
	db.SetLinkUp(true)
	f.SetFaults(Faults{UDLoss: 1})
	send(s, hca.SendWR{Data: small, RemoteQPN: r.qpn, RemoteQKey: 7}) // loss
	f.SetFaults(Faults{})
	send(s, hca.SendWR{ID: 99, Data: small, RemoteQPN: r.qpn, RemoteQKey: 7}) // delivered
	want := UDDrops{QKey: 1, PKey: 1, NoQP: 1, NoBuffer: 1, TooBig: 1, LinkDown: 1, Loss: 1}
	st := f.Stats()
	if st.UDDrops != want || st.UDMessages != 1 {
		t.Fatalf("drops %+v messages %d; want %+v and 1", st.UDDrops, st.UDMessages, want)
	}
	wcs := make([]hca.WC, 4)
	if n := rcq.Poll(wcs); n != 1 || wcs[0].ByteLen != 100 || wcs[0].SrcQPN != s.qpn {
		t.Fatalf("receiver polled %d: %+v", n, wcs[:n])
	}
}

func TestQPNAllocation(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		f := NewFabric(Config{Faults: Faults{ImmediateQPNReuse: reuse}})
		d, _ := f.NewDevice("a")
		c, _ := d.CreateCQ(hca.CQConfig{Size: 4})
		create := func() hca.QP {
			q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c, RecvCQ: c})
			must(t, err)
			return q
		}
		q1 := create()
		if q1.QPN() != firstQPN {
			t.Errorf("first QPN %#x, want %#x", q1.QPN(), firstQPN)
		}
		n := q1.QPN()
		must(t, q1.Destroy())
		q2 := create()
		if reuse != (q2.QPN() == n) {
			t.Errorf("reuse=%v: QPN after destroy %#x, freed %#x", reuse, q2.QPN(), n)
		}
		f.Close()
	}
}

func TestRNRRetryTimerSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Code 14 is 1.28 ms in the IBTA table; 3 retries wait 3 of them.
		r := newRig(t, Config{}, rigOpts{srq: true, rnrRetry: 3, minRNR: 14})
		start := time.Now()
		_, err := r.a.PostSend([]hca.SendWR{{ID: 5, Data: []byte("x")}})
		must(t, err)
		wc := r.waitCQ(t, r.acq, 1)[0]
		if wc.Status != hca.StatusRNRRetryExcErr || wc.ID != 5 {
			t.Fatalf("completion %+v", wc)
		}
		if got, want := time.Since(start), 3*1280*time.Microsecond; got != want {
			t.Fatalf("RNR retries took %v, want %v", got, want)
		}
		if st := r.f.Stats(); st.RNRNaks != 4 {
			t.Fatalf("RNRNaks %d, want 4 (first try + 3 retries)", st.RNRNaks)
		}
		r.f.Close()
	})
}

func TestRNRRetryFindsBufferPostedDuringWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, Config{}, rigOpts{srq: true, rnrRetry: 2, minRNR: 20}) // 10.24 ms
		_, err := r.a.PostSend([]hca.SendWR{{ID: 1, Data: []byte("hello")}})
		must(t, err)
		time.Sleep(5 * time.Millisecond) // fake clock: inside the RNR wait
		bufs := r.postRecvs(t, 1, 16)
		if n := r.acq.Poll(make([]hca.WC, 1)); n != 0 {
			t.Fatalf("send completed before the RNR timer ran out")
		}
		wc := r.waitCQ(t, r.acq, 1)[0]
		if wc.Status != hca.StatusSuccess || string(bufs[0][:5]) != "hello" {
			t.Fatalf("completion %+v payload %q", wc, bufs[0][:5])
		}
		r.f.Close()
	})
}

func TestTransportRetryTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, Config{}, rigOpts{retry: 3, timeout: 10}) // 4.096us * 1024
		must(t, r.b.Modify(hca.QPAttr{State: hca.QPStateError}))
		start := time.Now()
		_, err := r.a.PostSend([]hca.SendWR{{ID: 1, Data: []byte("x")}})
		must(t, err)
		wc := r.waitCQ(t, r.acq, 1)[0]
		if wc.Status != hca.StatusRetryExcErr {
			t.Fatalf("completion %+v", wc)
		}
		if got, want := time.Since(start), 3*4096*1024*time.Nanosecond; got != want {
			t.Fatalf("retries took %v, want %v", got, want)
		}
		if st := r.f.Stats(); st.TransportRetries != 3 {
			t.Fatalf("TransportRetries %d", st.TransportRetries)
		}
		r.f.Close()
	})
}

func TestCompletionDelayOrderAndAfterDestroy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 50
		r := newRig(t, Config{Seed: 9, Faults: Faults{CompletionDelay: CompletionDelay{Probability: 0.5, Max: time.Millisecond}}}, rigOpts{})
		r.postRecvs(t, n, 8)
		wrs := make([]hca.SendWR, n)
		for i := range wrs {
			wrs[i] = hca.SendWR{ID: uint64(i), Data: []byte{byte(i)}}
		}
		_, err := r.a.PostSend(wrs)
		must(t, err)
		if st := r.f.Stats(); st.PendingCompletion == 0 || st.DelayedCompletions == 0 {
			t.Fatalf("nothing delayed: %+v", st)
		}
		must(t, r.b.Destroy()) // completions still held for the destroyed QP
		for i, wc := range r.waitCQ(t, r.bcq, n) {
			if wc.ID != uint64(i) || wc.Context != "b" {
				t.Fatalf("receive %d: %+v", i, wc)
			}
		}
		for i, wc := range r.waitCQ(t, r.acq, n) {
			if wc.ID != uint64(i) {
				t.Fatalf("send %d: %+v", i, wc)
			}
		}
		if st := r.f.Stats(); st.CompletionsAfterDestroy != n || st.PendingCompletion != 0 {
			t.Fatalf("CompletionsAfterDestroy %d pending %d", st.CompletionsAfterDestroy, st.PendingCompletion)
		}
		r.f.Close()
	})
}

func TestLastWQEDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, Config{Faults: Faults{LastWQEDelay: 7 * time.Millisecond}}, rigOpts{srq: true})
		start := time.Now()
		must(t, r.b.Modify(hca.QPAttr{State: hca.QPStateError}))
		ev := <-r.lastEvents
		if ev.Type != hca.EventQPLastWQEReached || ev.QPN != r.b.qpn || time.Since(start) != 7*time.Millisecond {
			t.Fatalf("event %+v after %v", ev, time.Since(start))
		}
		must(t, r.b.Modify(hca.QPAttr{State: hca.QPStateReset}))
		must(t, r.b.Modify(hca.QPAttr{State: hca.QPStateError}))
		if ev := <-r.lastEvents; ev.Type != hca.EventQPLastWQEReached {
			t.Fatalf("after Reset and Error again: %+v", ev)
		}
		if got := r.f.Stats().LastWQEReached; got != 2 {
			t.Fatalf("LastWQEReached %d, want 2 (once per entry to Error)", got)
		}
		r.f.Close()
	})
}

func TestSpuriousCompletionEvents(t *testing.T) {
	f := NewFabric(Config{Faults: Faults{SpuriousCompletionEvents: 1}})
	defer f.Close()
	d, _ := f.NewDevice("a")
	fired := make(chan struct{}, 1)
	c, _ := d.CreateCQ(hca.CQConfig{Size: 4, OnCompletion: func() { fired <- struct{}{} }})
	if c.Notify(true) {
		t.Fatal("empty CQ reported missed events")
	}
	<-fired
	if n := c.Poll(make([]hca.WC, 4)); n != 0 {
		t.Fatalf("spurious event came with %d completions", n)
	}
	if got := f.Stats().SpuriousEvents; got != 1 {
		t.Fatalf("SpuriousEvents %d", got)
	}
}

func TestCQOverflowCounted(t *testing.T) {
	r := newRig(t, Config{}, rigOpts{cqSize: 2})
	r.postRecvs(t, 3, 8)
	_, err := r.a.PostSend([]hca.SendWR{{ID: 1}, {ID: 2}, {ID: 3}})
	must(t, err)
	if st := r.f.Stats(); st.CQOverflows != 2 { // one on each side
		t.Fatalf("CQOverflows %d, want 2", st.CQOverflows)
	}
}

func TestInjectedRNRStillDelivers(t *testing.T) {
	const n = 200
	r := newRig(t, Config{Seed: 4, TimerScale: 0.001, Faults: Faults{RNR: 0.3}}, rigOpts{rnrRetry: 7, minRNR: 1})
	bufs := r.postRecvs(t, n, 8)
	for i := range n {
		_, err := r.a.PostSend([]hca.SendWR{{ID: uint64(i), Data: []byte{byte(i), 1}}})
		must(t, err)
	}
	for i, wc := range r.waitCQ(t, r.acq, n) {
		if wc.Status != hca.StatusSuccess || wc.ID != uint64(i) {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
	for i := range n {
		if bufs[i][0] != byte(i) || bufs[i][1] != 1 {
			t.Fatalf("buffer %d holds %v", i, bufs[i][:2])
		}
	}
	if st := r.f.Stats(); st.RNRNaks == 0 || st.RCMessages != n {
		t.Fatalf("RNRNaks %d RCMessages %d", st.RNRNaks, st.RCMessages)
	}
}

func TestPurgeOnDestroy(t *testing.T) {
	r := newRig(t, Config{Faults: Faults{DestroyedQPCompletions: PurgeCompletionsOnDestroy}}, rigOpts{})
	r.postRecvs(t, 3, 8)
	_, err := r.a.PostSend([]hca.SendWR{{ID: 1}, {ID: 2}, {ID: 3}})
	must(t, err)
	must(t, r.b.Destroy())
	if n := r.bcq.Poll(make([]hca.WC, 8)); n != 0 {
		t.Fatalf("polled %d completions of a purged QP", n)
	}
	if n := r.acq.Poll(make([]hca.WC, 8)); n != 3 {
		t.Fatalf("sender lost completions: %d", n)
	}
	if got := r.f.Stats().PurgedCompletions; got != 3 {
		t.Fatalf("PurgedCompletions %d", got)
	}
}

func TestFaultsReproducible(t *testing.T) {
	run := func(seed int64) []uint64 {
		f := NewFabric(Config{Seed: seed, Faults: Faults{UDLoss: 0.5}})
		defer f.Close()
		da, _ := f.NewDevice("a")
		db, _ := f.NewDevice("b")
		mk := func(d *Device) (hca.QP, hca.CQ) {
			c, _ := d.CreateCQ(hca.CQConfig{Size: 512})
			q, _ := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: c, RecvCQ: c, MaxRecvWR: 256})
			must(t, q.Modify(hca.QPAttr{State: hca.QPStateInit, QKey: 1}))
			must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTR}))
			must(t, q.Modify(hca.QPAttr{State: hca.QPStateRTS}))
			return q, c
		}
		s, _ := mk(da)
		r, rc := mk(db)
		for i := range 200 {
			_, err := r.PostRecv([]hca.RecvWR{{ID: uint64(i), Buf: make([]byte, 8)}})
			must(t, err)
		}
		ah, _ := da.CreateAH(db.gid)
		for i := range 200 {
			_, err := s.PostSend([]hca.SendWR{{ID: uint64(i), Data: []byte{byte(i)}, AH: ah, RemoteQPN: r.QPN(), RemoteQKey: 1}})
			must(t, err)
		}
		wcs := make([]hca.WC, 512)
		n := rc.Poll(wcs)
		got := make([]uint64, 0, n)
		for _, wc := range wcs[:n] {
			got = append(got, uint64(wc.ID))
		}
		if lost := f.Stats().UDDrops.Loss; int(lost)+n != 200 {
			t.Fatalf("lost %d + delivered %d != 200", lost, n)
		}
		return got
	}
	a, b, c := run(11), run(11), run(12)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different losses")
	}
	if slices.Equal(a, c) {
		t.Fatalf("different seeds, identical losses")
	}
}

func TestCloseStopsEverything(t *testing.T) {
	f := NewFabric(Config{})
	d, _ := f.NewDevice("a")
	if g := f.Stats().Goroutines; g != 2 {
		t.Fatalf("%d goroutines, want 2", g)
	}
	c, _ := d.CreateCQ(hca.CQConfig{Size: 4})
	_, _ = d.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: c, RecvCQ: c})
	must(t, f.Close())
	st := f.Stats()
	if st.Goroutines != 0 || st.QPs != 0 || st.CQs != 0 || st.Devices != 0 {
		t.Fatalf("after Close: %+v", st)
	}
	if _, err := d.CreateCQ(hca.CQConfig{Size: 4}); !errors.Is(err, hca.ErrDestroyed) {
		t.Fatalf("create on a closed device: %v", err)
	}
	if _, err := f.NewDevice("b"); !errors.Is(err, hca.ErrDestroyed) {
		t.Fatalf("new device on a closed fabric: %v", err)
	}
}

func TestStateNames(t *testing.T) {
	for s, want := range map[sendState]string{sendReady: "ready", sendRNRWait: "rnr-wait", sendBufferWait: "buffer-wait", sendRetryWait: "retry-wait", 9: "sendState(9)"} {
		if s.String() != want {
			t.Errorf("%d: %q", int(s), s.String())
		}
	}
	if rcRemoteTooLong.String() != "remote-too-long" || PurgeCompletionsOnDestroy.String() != "purge" {
		t.Error("names")
	}
}

func TestParkedSenderFailsWhenReceiverDestroyed(t *testing.T) {
	r := newRig(t, Config{}, rigOpts{srq: true, rnrRetry: 7})
	_, err := r.a.PostSend([]hca.SendWR{{ID: 3, Data: []byte("x")}})
	must(t, err)
	if r.a.sendState != sendBufferWait {
		t.Fatalf("sender state %s, want buffer-wait", r.a.sendState)
	}
	must(t, r.b.Destroy())
	wc := r.waitCQ(t, r.acq, 1)[0]
	if wc.Status != hca.StatusRetryExcErr || wc.ID != 3 {
		t.Fatalf("completion %+v, want RETRY_EXC_ERR", wc)
	}
	if r.a.State() != hca.QPStateError {
		t.Fatalf("sender state %s", r.a.State())
	}
}
