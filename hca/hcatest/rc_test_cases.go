package hcatest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// ipoibCMBuf is the largest message IPoIB-CM sends (IPOIB_CM_BUF_SIZE).
const ipoibCMBuf = 65524

func testRCSizes(t *testing.T, f Fabric) {
	a, b := rcPair(t, f, qpOpts{}, qpOpts{})
	sizes := []int{1, 2, 63, 4095, 4096, 4097, 8192, ipoibCMBuf}
	rng := rand.New(rand.NewPCG(4755, 4391))
	for range 8 {
		sizes = append(sizes, 1+rng.IntN(ipoibCMBuf))
	}
	send := make([][]byte, len(sizes))
	recv := make([][]byte, len(sizes))
	for i, n := range sizes {
		recv[i] = alloc(t, b.dev, ipoibCMBuf)
		postRecv(t, b.qp, hca.RecvWR{ID: uint64(100 + i), Buf: recv[i]})
		send[i] = alloc(t, a.dev, n)
		fill(send[i], i)
	}
	for i := range sizes {
		postSend(t, a.qp, hca.SendWR{ID: uint64(i), Data: send[i]})
	}
	swc := a.sendCQ.wait(t, len(sizes))
	rwc := b.recvCQ.wait(t, len(sizes))
	for i, n := range sizes {
		expectWC(t, swc[i], uint64(i), hca.StatusSuccess, hca.WCSend)
		expectWC(t, rwc[i], uint64(100+i), hca.StatusSuccess, hca.WCRecv)
		if rwc[i].ByteLen != n || rwc[i].QPN != b.qp.QPN() {
			t.Fatalf("size %d: recv completion %+v", n, rwc[i])
		}
		if !bytes.Equal(recv[i][:n], send[i]) {
			t.Fatalf("size %d: payload differs", n)
		}
	}
}

func testRCOrder(t *testing.T, f Fabric) {
	const n, batch = 256, 32
	a, b := rcPair(t, f, qpOpts{maxSend: n, ctx: "sender"}, qpOpts{maxRecv: n, ctx: "receiver"})
	rbuf := alloc(t, b.dev, n*8)
	sbuf := alloc(t, a.dev, n*8)
	wrs := make([]hca.RecvWR, n)
	for i := range wrs {
		wrs[i] = hca.RecvWR{ID: uint64(i), Buf: rbuf[i*8 : i*8+8]}
	}
	postRecv(t, b.qp, wrs...)
	for i := 0; i < n; i += batch {
		sw := make([]hca.SendWR, batch)
		for j := range sw {
			k := i + j
			sbuf[k*8] = byte(k)
			sbuf[k*8+1] = byte(k >> 8)
			sw[j] = hca.SendWR{ID: uint64(1000 + k), Data: sbuf[k*8 : k*8+2]}
		}
		postSend(t, a.qp, sw...)
	}
	swc := a.sendCQ.wait(t, n)
	rwc := b.recvCQ.wait(t, n)
	for i := range n {
		expectWC(t, swc[i], uint64(1000+i), hca.StatusSuccess, hca.WCSend)
		if swc[i].Context != "sender" {
			t.Fatalf("send completion %d context %v", i, swc[i].Context)
		}
		expectWC(t, rwc[i], uint64(i), hca.StatusSuccess, hca.WCRecv)
		got := int(rbuf[i*8]) | int(rbuf[i*8+1])<<8
		if got != i || rwc[i].ByteLen != 2 || rwc[i].Context != "receiver" {
			t.Fatalf("receive %d carries message %d (%+v)", i, got, rwc[i])
		}
	}
}

func testSRQShared(t *testing.T, f Fabric) {
	const n = 1000
	da, db := f.NewDevice(t), f.NewDevice(t)
	if lim := db.Limits(); lim.MaxQP < n+8 {
		t.Skipf("backend limit MaxQP %d < %d", lim.MaxQP, n+8)
	}
	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: n})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	scq, rcq := newCQ(t, f, da, 2*n), newCQ(t, f, db, 2*n)
	rbuf := alloc(t, db, n*16)
	wrs := make([]hca.RecvWR, n)
	for i := range wrs {
		wrs[i] = hca.RecvWR{ID: uint64(i), Buf: rbuf[i*16 : i*16+16]}
	}
	postRecv(t, srq, wrs...)
	if got := srq.Posted(); got != n {
		t.Fatalf("SRQ Posted %d, want %d", got, n)
	}
	senders := make([]*endpoint, n)
	for i := range n {
		// Retries on: 1000 messages at once can overrun a UDP backend's
		// socket buffer on a loaded machine, and the SRQ, not loss, is
		// under test here.
		o := qpOpts{sendCQ: scq, recvCQ: scq, ctx: i, maxSend: 4, maxRecv: 4, retry: 7}
		senders[i] = newEndpoint(t, f, da, hca.QPTypeRC, o)
		r := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq, sendCQ: rcq, recvCQ: rcq, ctx: i, maxSend: 4})
		connect(t, senders[i], r, o, qpOpts{})
	}
	sbuf := alloc(t, da, n*4)
	for i, s := range senders {
		m := sbuf[i*4 : i*4+4]
		m[0], m[1], m[2], m[3] = byte(i), byte(i>>8), 0xAB, 0xCD
		postSend(t, s.qp, hca.SendWR{ID: uint64(i), Data: m})
	}
	for _, wc := range scq.wait(t, n) {
		if wc.Status != hca.StatusSuccess || wc.Context != int(wc.ID) {
			t.Fatalf("send completion %+v", wc)
		}
	}
	seen := make(map[int]bool, n)
	for _, wc := range rcq.wait(t, n) {
		if wc.Status != hca.StatusSuccess || wc.ByteLen != 4 {
			t.Fatalf("recv completion %+v", wc)
		}
		m := rbuf[wc.ID*16:]
		from := int(m[0]) | int(m[1])<<8
		if ctx, _ := wc.Context.(int); ctx != from || m[2] != 0xAB || seen[from] {
			t.Fatalf("buffer %d holds message of QP %d, completion context %v (dup %v)", wc.ID, from, wc.Context, seen[from])
		}
		seen[from] = true
	}
	if got := srq.Posted(); got != 0 {
		t.Fatalf("SRQ Posted %d after %d receives, want 0", got, n)
	}
}

func testSRQLimit(t *testing.T, f Fabric) {
	da, db := f.NewDevice(t), f.NewDevice(t)
	events := newEventLog()
	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: 16, OnEvent: events.record})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	if err := srq.ArmLimit(17); !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("ArmLimit above MaxWR: %v, want ErrInvalidArgument", err)
	}
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{})
	b := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq})
	connect(t, a, b, qpOpts{}, qpOpts{})
	buf := alloc(t, db, 8*64)
	for i := range 8 {
		postRecv(t, srq, hca.RecvWR{ID: uint64(i), Buf: buf[i*64 : i*64+64]})
	}
	if err := srq.ArmLimit(6); err != nil {
		t.Fatalf("ArmLimit: %v", err)
	}
	msg := alloc(t, da, 8)
	postSend(t, a.qp, hca.SendWR{ID: 1, Data: msg}, hca.SendWR{ID: 2, Data: msg})
	b.recvCQ.wait(t, 2)
	if events.count(hca.EventSRQLimitReached, 0) != 0 {
		t.Fatalf("SRQ limit event with 6 buffers left and limit 6")
	}
	postSend(t, a.qp, hca.SendWR{ID: 3, Data: msg}, hca.SendWR{ID: 4, Data: msg})
	b.recvCQ.wait(t, 2)
	events.waitFor(t, timeout(f), hca.EventSRQLimitReached, 0)
	a.sendCQ.wait(t, 4)
	if got := srq.Posted(); got != 4 {
		t.Fatalf("Posted %d, want 4", got)
	}
	if n := events.count(hca.EventSRQLimitReached, 0); n != 1 {
		t.Fatalf("%d SRQ limit events, want 1 (the limit disarms)", n)
	}
}

func testRNR0(t *testing.T, f Fabric) {
	da, db := f.NewDevice(t), f.NewDevice(t)
	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: 4})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{})
	b := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq})
	connect(t, a, b, qpOpts{rnrRetry: 0}, qpOpts{minRNR: 1})
	msg := alloc(t, da, 32)
	postSend(t, a.qp, hca.SendWR{ID: 7, Data: msg}, hca.SendWR{ID: 8, Data: msg})
	wcs := a.sendCQ.wait(t, 2)
	expectWC(t, wcs[0], 7, hca.StatusRNRRetryExcErr, hca.WCSend)
	expectWC(t, wcs[1], 8, hca.StatusWRFlushErr, hca.WCSend)
	expectState(t, a.qp, hca.QPStateError)
	if got := b.recvCQ.pollNow(); len(got) != 0 {
		t.Fatalf("receiver completions %+v with an empty SRQ", got)
	}
}

func testRNR7(t *testing.T, f Fabric) {
	da, db := f.NewDevice(t), f.NewDevice(t)
	srq, err := db.CreateSRQ(hca.SRQConfig{MaxWR: 4})
	if err != nil {
		t.Fatalf("create SRQ: %v", err)
	}
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{})
	b := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{srq: srq})
	connect(t, a, b, qpOpts{rnrRetry: 7}, qpOpts{minRNR: 1})
	msg := alloc(t, da, 32)
	fill(msg, 7)
	postSend(t, a.qp, hca.SendWR{ID: 70, Data: msg})
	if got := a.sendCQ.pollNow(); len(got) != 0 {
		t.Fatalf("send completed %+v before any buffer was posted", got)
	}
	expectState(t, a.qp, hca.QPStateRTS)
	buf := alloc(t, db, 64)
	postRecv(t, srq, hca.RecvWR{ID: 71, Buf: buf})
	expectWC(t, a.sendCQ.wait(t, 1)[0], 70, hca.StatusSuccess, hca.WCSend)
	r := b.recvCQ.wait(t, 1)[0]
	expectWC(t, r, 71, hca.StatusSuccess, hca.WCRecv)
	if r.ByteLen != 32 || !bytes.Equal(buf[:32], msg) {
		t.Fatalf("payload after RNR wait differs (%d bytes)", r.ByteLen)
	}
}

func testTooLong(t *testing.T, f Fabric) {
	a, b := rcPair(t, f, qpOpts{}, qpOpts{})
	postRecv(t, b.qp, hca.RecvWR{ID: 5, Buf: alloc(t, b.dev, 100)}, hca.RecvWR{ID: 6, Buf: alloc(t, b.dev, 100)})
	postSend(t, a.qp, hca.SendWR{ID: 9, Data: alloc(t, a.dev, 200)})
	expectWC(t, a.sendCQ.wait(t, 1)[0], 9, hca.StatusRemInvReqErr, hca.WCSend)
	rw := b.recvCQ.wait(t, 2)
	expectWC(t, rw[0], 5, hca.StatusLocLenErr, hca.WCRecv)
	expectWC(t, rw[1], 6, hca.StatusWRFlushErr, hca.WCRecv)
	expectState(t, a.qp, hca.QPStateError)
	expectState(t, b.qp, hca.QPStateError)
}

func testUnreachable(t *testing.T, f Fabric) {
	da, db := f.NewDevice(t), f.NewDevice(t)
	a := newEndpoint(t, f, da, hca.QPTypeRC, qpOpts{})
	b := newEndpoint(t, f, db, hca.QPTypeRC, qpOpts{})
	// b stays in Init: a's requests go unanswered.
	modify(t, a.qp, hca.QPAttr{State: hca.QPStateInit})
	modify(t, a.qp, hca.QPAttr{State: hca.QPStateRTR, DestQPN: b.qp.QPN(), DestGID: db.Port().GID, PathMTU: hca.MTU4096})
	modify(t, a.qp, hca.QPAttr{State: hca.QPStateRTS, RetryCount: 0, Timeout: 1})
	modify(t, b.qp, hca.QPAttr{State: hca.QPStateInit})
	postSend(t, a.qp, hca.SendWR{ID: 1, Data: alloc(t, da, 10)})
	expectWC(t, a.sendCQ.wait(t, 1)[0], 1, hca.StatusRetryExcErr, hca.WCSend)
	expectState(t, a.qp, hca.QPStateError)
}
