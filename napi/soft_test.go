package napi_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/napi"
)

// TestOverSoftFabricRC runs an RC stream between two soft devices with one
// Context on each side's CQ, while the fabric fires spurious completion
// events and holds completions back, and checks that every message is
// received once, in order, intact, and every send completes.
func TestOverSoftFabricRC(t *testing.T) {
	const (
		messages = 3000
		msgSize  = 64
		rxBufs   = 256
		credits  = 128 // sends outstanding, well below MaxSendWR
	)
	f := soft.NewFabric(soft.Config{
		Seed:       7,
		TimerScale: 0.001,
		Faults: soft.Faults{
			SpuriousCompletionEvents: 0.3,
			CompletionDelay:          soft.CompletionDelay{Probability: 0.02, Max: 200 * time.Microsecond},
		},
	})
	defer f.Close()
	da, err := f.NewDevice("a")
	if err != nil {
		t.Fatal(err)
	}
	db, err := f.NewDevice("b")
	if err != nil {
		t.Fatal(err)
	}

	var tx, rx *napi.Context
	txCQ, err := da.CreateCQ(hca.CQConfig{Size: 1024, OnCompletion: func() { tx.Schedule() }})
	if err != nil {
		t.Fatal(err)
	}
	rxCQ, err := db.CreateCQ(hca.CQConfig{Size: 1024, OnCompletion: func() { rx.Schedule() }})
	if err != nil {
		t.Fatal(err)
	}
	qa, err := da.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: txCQ, RecvCQ: txCQ, MaxSendWR: 512, MaxRecvWR: 16, Context: "a"})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := db.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: rxCQ, RecvCQ: rxCQ, MaxSendWR: 16, MaxRecvWR: rxBufs, Context: "b"})
	if err != nil {
		t.Fatal(err)
	}
	connect(t, qa, qb, db.Port().GID)
	connect(t, qb, qa, da.Port().GID)

	rxMem, err := db.Alloc(rxBufs * msgSize)
	if err != nil {
		t.Fatal(err)
	}
	rxBuf := func(i uint64) []byte { return rxMem[i*msgSize : (i+1)*msgSize] }
	for i := range uint64(rxBufs) {
		if _, err := qb.PostRecv([]hca.RecvWR{{ID: i, Buf: rxBuf(i)}}); err != nil {
			t.Fatal(err)
		}
	}

	// Receiver: check order and payload, give the buffer back.
	var received uint64
	var rxErr error
	allReceived := make(chan struct{})
	rx, err = napi.New(napi.Config{Name: "b-rx", CQ: rxCQ, Budget: 8, Batch: 3, Handle: func(wcs []hca.WC) {
		for _, wc := range wcs {
			if rxErr != nil {
				return
			}
			buf := rxBuf(wc.ID)
			switch seq := binary.BigEndian.Uint64(buf); {
			case wc.Status != hca.StatusSuccess || wc.Opcode != hca.WCRecv || wc.Context != "b":
				rxErr = fmt.Errorf("unexpected receive completion %+v", wc)
			case seq != received || wc.ByteLen != msgSize:
				rxErr = fmt.Errorf("received seq %d (%d bytes), want %d", seq, wc.ByteLen, received)
			}
			received++
			if _, err := qb.PostRecv([]hca.RecvWR{{ID: wc.ID, Buf: buf}}); err != nil {
				rxErr = fmt.Errorf("repost: %w", err)
			}
			if received == messages {
				close(allReceived)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	// Sender: a send completion returns a credit.
	credit := make(chan struct{}, credits)
	var sendFailures, sent uint64
	tx, err = napi.New(napi.Config{Name: "a-tx", CQ: txCQ, Handle: func(wcs []hca.WC) {
		for _, wc := range wcs {
			if wc.Status != hca.StatusSuccess || wc.Opcode != hca.WCSend {
				sendFailures++
			}
			sent++
			<-credit
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	rx.Start()
	tx.Start()
	defer rx.Stop()
	defer tx.Stop()

	txMem, err := da.Alloc(credits * msgSize)
	if err != nil {
		t.Fatal(err)
	}
	for seq := range uint64(messages) {
		credit <- struct{}{}
		// The credit bounds outstanding sends, so slot seq%credits is
		// free once its credit was taken.
		buf := txMem[(seq%credits)*msgSize : (seq%credits+1)*msgSize]
		binary.BigEndian.PutUint64(buf, seq)
		if _, err := qa.PostSend([]hca.SendWR{{ID: seq, Data: buf}}); err != nil {
			t.Fatalf("send %d: %v", seq, err)
		}
	}

	select {
	case <-allReceived:
	case <-time.After(30 * time.Second):
		t.Fatalf("lost wake-up: rx stats %+v, tx stats %+v", rx.Stats(), tx.Stats())
	}
	// Every credit back means every send completed.
	for range credits {
		credit <- struct{}{}
	}
	rx.Stop()
	tx.Stop()

	if rxErr != nil {
		t.Fatal(rxErr)
	}
	if sent != messages || sendFailures != 0 {
		t.Errorf("%d send completions, %d failed; want %d, 0", sent, sendFailures, messages)
	}
	rs, ts, fs := rx.Stats(), tx.Stats(), f.Stats()
	if rs.Completions != messages || ts.Completions != messages {
		t.Errorf("napi completions rx %d tx %d, want %d each", rs.Completions, ts.Completions, messages)
	}
	if rs.MaxPerPoll > 8 {
		t.Errorf("rx MaxPerPoll %d over budget 8", rs.MaxPerPoll)
	}
	if fs.CQOverflows != 0 {
		t.Errorf("%d CQ overflows", fs.CQOverflows)
	}
	if fs.SpuriousEvents == 0 {
		t.Errorf("the fabric fired no spurious events; the fault was not exercised")
	}
	t.Logf("rx %+v\ntx %+v\nfabric spurious %d delayed %d", rs, ts, fs.SpuriousEvents, fs.DelayedCompletions)
}

func connect(t *testing.T, q, peer hca.QP, peerGID hca.GID) {
	t.Helper()
	for _, attr := range []hca.QPAttr{
		{State: hca.QPStateInit},
		{State: hca.QPStateRTR, DestQPN: peer.QPN(), DestGID: peerGID, PathMTU: hca.MTU4096, MinRNRTimer: 1},
		{State: hca.QPStateRTS, RetryCount: 7, RNRRetry: 7},
	} {
		if err := q.Modify(attr); err != nil {
			t.Fatalf("QP %d to %v: %v", q.QPN(), attr.State, err)
		}
	}
}
