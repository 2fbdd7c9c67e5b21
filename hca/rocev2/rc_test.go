package rocev2

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// sendAndCheck sends messages of the given sizes from a to b and checks
// every byte and every completion, in order.
func sendAndCheck(t *testing.T, a, b *rcEnd, sizes []int) {
	t.Helper()
	bufs := make([][]byte, len(sizes))
	for i := range sizes {
		bufs[i], _ = b.dev.Alloc(65536)
		if _, err := b.qp.PostRecv([]hca.RecvWR{{ID: uint64(1000 + i), Buf: bufs[i]}}); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make([][]byte, len(sizes))
	for i, n := range sizes {
		msgs[i], _ = a.dev.Alloc(n)
		fill(msgs[i], i+1)
		if _, err := a.qp.PostSend([]hca.SendWR{{ID: uint64(i), Data: msgs[i]}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, wc := range a.sendCQ.wait(t, len(sizes)) {
		if wc.ID != uint64(i) || wc.Status != hca.StatusSuccess || wc.Opcode != hca.WCSend || wc.ByteLen != sizes[i] {
			t.Fatalf("send completion %d: %+v\na: %+v\nb: %+v", i, wc, a.dev.Stats(), b.dev.Stats())
		}
	}
	for i, wc := range b.recvCQ.wait(t, len(sizes)) {
		if wc.ID != uint64(1000+i) || wc.Status != hca.StatusSuccess || wc.ByteLen != sizes[i] || wc.QPN != b.qp.QPN() {
			t.Fatalf("recv completion %d: %+v", i, wc)
		}
		if !bytes.Equal(bufs[i][:sizes[i]], msgs[i]) {
			t.Fatalf("message %d (%d bytes) corrupted", i, sizes[i])
		}
		if wc.Context != "ctx-"+b.dev.Name() {
			t.Fatalf("context %v", wc.Context)
		}
	}
}

var rcSizes = []int{0, 1, 3, 4095, 4096, 4097, 8192, 12289, 65520, 65524}

func TestRCSendRecvSizesAcrossPSNWrap(t *testing.T) {
	f := newTestFabric(t, 20, Faults{})
	a, b := newRCEnd(t, f.newDevice(t), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	sendAndCheck(t, a, b, rcSizes)
	sendAndCheck(t, b, a, []int{100, 65536})
	sa := a.dev.Stats()
	if sa.Retransmits != 0 || sa.TotalDropped() != 0 || sa.Timeouts != 0 {
		t.Fatalf("lossless run had retransmits/drops: %+v", sa)
	}
	if sa.AcksSent == 0 || b.dev.Stats().AcksSent == 0 {
		t.Fatal("no ACKs sent")
	}
}

// TestRCRecoversFromLoss drops, duplicates, delays and reorders datagrams on both
// links; with infinite retries every message must arrive intact and in
// order, through go-back-N, sequence NAKs and duplicate re-ACKs.
func TestRCRecoversFromLoss(t *testing.T) {
	f := newTestFabric(t, 21, Faults{Seed: 42, Drop: 0.05, Duplicate: 0.05, Reorder: 0.05, Delay: 0.05, DelayTime: 2 * time.Millisecond})
	o := rcOpts{retry: 7, rnrRetry: 7, minRNR: 1}
	a, b := newRCEnd(t, f.newDevice(t), o), newRCEnd(t, f.newDevice(t), o)
	connectRC(t, a, b, o, o)
	r := rand.New(rand.NewPCG(1, 2))
	sizes := make([]int, 60)
	for i := range sizes {
		sizes[i] = r.IntN(65524) + 1
	}
	sendAndCheck(t, a, b, sizes)
	sa, sb := a.dev.Stats(), b.dev.Stats()
	if sa.FaultDropped == 0 || sa.FaultDelayed == 0 || sa.Retransmits == 0 {
		t.Fatalf("faults not exercised: %+v", sa)
	}
	if sb.SeqNAKsSent == 0 && sa.Timeouts == 0 {
		t.Fatalf("no recovery path taken: a %+v b %+v", sa, sb)
	}
	t.Logf("a: dropped %d dup %d reord %d retrans %d timeouts %d seqNAKrx %d; b: dups %d seqNAK %d",
		sa.FaultDropped, sa.FaultDuplicated, sa.FaultReordered, sa.Retransmits, sa.Timeouts, sa.SeqNAKsReceived,
		sb.Duplicates, sb.SeqNAKsSent)
}

func TestRCRetryExceededOnDeadPeer(t *testing.T) {
	f := newTestFabric(t, 22, Faults{})
	a, b := newRCEnd(t, f.newDevice(t), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{retry: 2}, rcOpts{})
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	msg, _ := a.dev.Alloc(10)
	if _, err := a.qp.PostSend([]hca.SendWR{{ID: 1, Data: msg}, {ID: 2, Data: msg}}); err != nil {
		t.Fatal(err)
	}
	wcs := a.sendCQ.wait(t, 2)
	if wcs[0].ID != 1 || wcs[0].Status != hca.StatusRetryExcErr || wcs[1].ID != 2 || wcs[1].Status != hca.StatusWRFlushErr {
		t.Fatalf("completions %+v", wcs)
	}
	if a.qp.State() != hca.QPStateError {
		t.Fatalf("state %v", a.qp.State())
	}
	if s := a.dev.Stats(); s.Timeouts != 3 {
		t.Fatalf("timeouts %d, want 3 (1 + 2 retries)", s.Timeouts)
	}
	if s := b.dev.Stats(); s.Dropped(wire.DropUnknownQP) != 6 {
		t.Fatalf("receiver unknown-QP drops %d, want 6 (3 rounds of 2 packets)", s.Dropped(wire.DropUnknownQP))
	}
}

func TestRCRNR(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rnrRetry uint8
	}{{"retry0", 0}, {"retry7", 7}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFabric(t, 23, Faults{})
			db := f.newDevice(t)
			srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: 4})
			if err != nil {
				t.Fatal(err)
			}
			a := newRCEnd(t, f.newDevice(t), rcOpts{})
			b := newRCEnd(t, db, rcOpts{srq: srq})
			connectRC(t, a, b, rcOpts{rnrRetry: tc.rnrRetry}, rcOpts{minRNR: 1})
			msg, _ := a.dev.Alloc(5000)
			fill(msg, 9)
			if _, err := a.qp.PostSend([]hca.SendWR{{ID: 7, Data: msg}}); err != nil {
				t.Fatal(err)
			}
			if tc.rnrRetry == 0 {
				wc := a.sendCQ.wait(t, 1)[0]
				if wc.Status != hca.StatusRNRRetryExcErr || a.qp.State() != hca.QPStateError {
					t.Fatalf("completion %+v state %v", wc, a.qp.State())
				}
				return
			}
			// Let a few RNR NAKs pass before a buffer appears: wait for the
			// receiver to have sent some.
			f.waitRx(t, db, func(s Stats) bool { return s.RNRNAKsSent >= 3 })
			if got := a.sendCQ.Poll(make([]hca.WC, 1)); got != 0 {
				t.Fatal("send completed without a buffer")
			}
			buf, _ := db.Alloc(8192)
			if _, err := srq.PostRecv([]hca.RecvWR{{ID: 8, Buf: buf}}); err != nil {
				t.Fatal(err)
			}
			if wc := a.sendCQ.wait(t, 1)[0]; wc.Status != hca.StatusSuccess {
				t.Fatalf("send %+v", wc)
			}
			if wc := b.recvCQ.wait(t, 1)[0]; wc.ID != 8 || wc.ByteLen != 5000 || !bytes.Equal(buf[:5000], msg) {
				t.Fatalf("recv %+v", wc)
			}
		})
	}
}

func TestRCMessageTooLong(t *testing.T) {
	f := newTestFabric(t, 24, Faults{})
	a, b := newRCEnd(t, f.newDevice(t), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	small, _ := b.dev.Alloc(100)
	if _, err := b.qp.PostRecv([]hca.RecvWR{{ID: 5, Buf: small}, {ID: 6, Buf: small}}); err != nil {
		t.Fatal(err)
	}
	big, _ := a.dev.Alloc(5000)
	if _, err := a.qp.PostSend([]hca.SendWR{{ID: 9, Data: big}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.sendCQ.wait(t, 1)[0]; wc.ID != 9 || wc.Status != hca.StatusRemInvReqErr {
		t.Fatalf("send %+v", wc)
	}
	rw := b.recvCQ.wait(t, 2)
	if rw[0].ID != 5 || rw[0].Status != hca.StatusLocLenErr || rw[1].ID != 6 || rw[1].Status != hca.StatusWRFlushErr {
		t.Fatalf("recv %+v", rw)
	}
	if a.qp.State() != hca.QPStateError || b.qp.State() != hca.QPStateError {
		t.Fatal("QPs not in Error")
	}
}

func TestRCErrorFlushLastWQEAndDrain(t *testing.T) {
	f := newTestFabric(t, 25, Faults{})
	db := f.newDevice(t)
	srq, _ := db.CreateSRQ(hca.SRQConfig{MaxWR: 16})
	events := make(chan hca.AsyncEvent, 4)
	cq := newWaitCQ(t, db, 64)
	qp, err := db.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: cq.CQ, RecvCQ: cq.CQ, SRQ: srq, MaxSendWR: 8,
		Context: 42, OnEvent: func(ev hca.AsyncEvent) { events <- ev }})
	if err != nil {
		t.Fatal(err)
	}
	a := newRCEnd(t, f.newDevice(t), rcOpts{})
	b := &rcEnd{dev: db, qp: qp, sendCQ: cq, recvCQ: cq}
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	buf, _ := db.Alloc(100)
	_, _ = srq.PostRecv([]hca.RecvWR{{ID: 1, Buf: buf}, {ID: 2, Buf: buf}})
	msg, _ := a.dev.Alloc(10)
	_, _ = a.qp.PostSend([]hca.SendWR{{ID: 3, Data: msg}})
	if wc := cq.wait(t, 1)[0]; wc.ID != 1 || wc.Status != hca.StatusSuccess || wc.Context != 42 {
		t.Fatalf("recv %+v", wc)
	}
	mustModify(t, qp, hca.QPAttr{State: hca.QPStateError})
	mustModify(t, qp, hca.QPAttr{State: hca.QPStateError})
	// The drain WR: accepted on an errored QP, flushed behind everything.
	if n, err := qp.PostSend([]hca.SendWR{{ID: 99}}); n != 1 || err != nil {
		t.Fatalf("post drain: %d %v", n, err)
	}
	if wc := cq.wait(t, 1)[0]; wc.ID != 99 || wc.Status != hca.StatusWRFlushErr || wc.Context != 42 {
		t.Fatalf("drain %+v", wc)
	}
	ev := <-events
	if ev.Type != hca.EventQPLastWQEReached || ev.QPN != qp.QPN() || ev.Context != 42 {
		t.Fatalf("event %+v", ev)
	}
	select {
	case ev := <-events:
		t.Fatalf("second event %+v", ev)
	default:
	}
	if srq.Posted() != 1 {
		t.Fatalf("SRQ posted %d, want 1 (buffer 2 stays with the SRQ)", srq.Posted())
	}
}

// TestRCMinRetryCountSurvivesLoss: QPs that ask for retry count 0, as
// IPoIB-CM does, survive 2% loss when the device raises the floor, and
// fail without it.
func TestRCMinRetryCountSurvivesLoss(t *testing.T) {
	for _, tc := range []struct {
		name     string
		floor    uint8
		wantFail bool
	}{{"floor6", 6, false}, {"nofloor", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFabric(t, 26, Faults{Seed: 5, Drop: 0.02})
			var devs [2]*Device
			for i := range devs {
				cfg := f.config(t)
				cfg.MinRetryCount = tc.floor
				cfg.MinAckTimeout = 20 * time.Millisecond
				devs[i] = f.open(t, cfg)
			}
			o := rcOpts{minRNR: 1}
			a, b := newRCEnd(t, devs[0], o), newRCEnd(t, devs[1], o)
			connectRC(t, a, b, o, o)
			sizes := make([]int, 40)
			for i := range sizes {
				sizes[i] = 65520
			}
			if !tc.wantFail {
				sendAndCheck(t, a, b, sizes)
				if s := a.dev.Stats(); s.FaultDropped == 0 || s.Retransmits == 0 {
					t.Fatalf("loss not exercised: %+v", s)
				}
				return
			}
			bufs := make([]hca.RecvWR, len(sizes))
			for i := range bufs {
				buf, _ := b.dev.Alloc(65536)
				bufs[i] = hca.RecvWR{ID: uint64(i), Buf: buf}
			}
			if _, err := b.qp.PostRecv(bufs); err != nil {
				t.Fatal(err)
			}
			msg, _ := a.dev.Alloc(65520)
			for i := range sizes {
				if _, err := a.qp.PostSend([]hca.SendWR{{ID: uint64(i), Data: msg}}); err != nil {
					t.Fatal(err)
				}
			}
			failed := false
			for _, wc := range a.sendCQ.wait(t, len(sizes)) {
				if wc.Status == hca.StatusRetryExcErr {
					failed = true
				}
			}
			if !failed || a.qp.State() != hca.QPStateError {
				t.Fatalf("retry count 0 survived 2%% loss: state %v", a.qp.State())
			}
		})
	}
}

// TestRCTimerKicksPerBurst: a requester that goes idle between messages
// disarms and re-arms its retry timer on every message; the timer loop
// is woken only for a deadline earlier than the one it sleeps toward,
// not once per message (each wake is a goroutine hand-off on the data
// path).
func TestRCTimerKicksPerBurst(t *testing.T) {
	f := newTestFabric(t, 22, Faults{})
	a, b := newRCEnd(t, f.newDevice(t), rcOpts{}), newRCEnd(t, f.newDevice(t), rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	before := a.dev.timerKicks.Load()
	start := time.Now()
	const bursts = 100
	for i := range bursts {
		sendAndCheck(t, a, b, []int{4096 + i})
	}
	kicks := a.dev.timerKicks.Load() - before
	// The loop is kicked about once per timeout period the bursts span
	// (a.dev's MinAckTimeout, 250 ms), so a run slowed down by a loaded
	// machine may take more; one kick per burst is what must not happen.
	periods := int(time.Since(start)/(250*time.Millisecond)) + 1
	if limit := max(bursts/10, 2*periods); kicks > uint64(limit) {
		t.Fatalf("%d timer-loop kicks for %d bursts in %d timeout periods of 250 ms: want about one per period, not one per burst", kicks, bursts, periods)
	}
	if s := a.dev.Stats(); s.Timeouts != 0 || s.Retransmits != 0 {
		t.Fatalf("lossless run timed out: %+v", s)
	}
}
