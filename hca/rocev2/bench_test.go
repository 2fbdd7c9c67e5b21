package rocev2

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// BenchmarkRC65524 streams IPoIB-CM sized messages (16 packets each at
// MTU 4096) over loopback between two devices, 32 messages in flight.
func BenchmarkRC65524(b *testing.B) {
	t := &testing.T{}
	f := newTestFabric(t, 40, Faults{})
	defer func() {
		for _, d := range f.devs {
			_ = d.Close()
		}
	}()
	o := rcOpts{retry: 7, rnrRetry: 7, minRNR: 1, maxSend: 64}
	src, dst := newRCEnd(t, f.newDevice(t), o), newRCEnd(t, f.newDevice(t), o)
	connectRC(t, src, dst, o, o)
	const size, depth = 65524, 32
	msg, _ := src.dev.Alloc(size)
	recvBufs := make([]hca.RecvWR, depth*2)
	for i := range recvBufs {
		buf, _ := dst.dev.Alloc(size)
		recvBufs[i] = hca.RecvWR{ID: uint64(i), Buf: buf}
	}
	if _, err := dst.qp.PostRecv(recvBufs); err != nil {
		b.Fatal(err)
	}
	wcs := make([]hca.WC, 64)
	wr := []hca.SendWR{{Data: msg}}
	repost := make([]hca.RecvWR, 1)
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	posted, sent, received := 0, 0, 0
	for received < b.N {
		for posted < b.N && posted-sent < depth {
			if _, err := src.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		if n := src.sendCQ.Poll(wcs); n > 0 {
			for _, wc := range wcs[:n] {
				if wc.Status != hca.StatusSuccess {
					b.Fatalf("send %+v", wc)
				}
			}
			sent += n
		}
		n := dst.recvCQ.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Status != hca.StatusSuccess || wc.ByteLen != size {
				b.Fatalf("recv %+v", wc)
			}
			repost[0] = recvBufs[wc.ID]
			if _, err := dst.qp.PostRecv(repost); err != nil {
				b.Fatal(err)
			}
		}
		received += n
		if n == 0 && !dst.recvCQ.Notify(true) {
			<-dst.recvCQ.wake
		}
	}
	b.StopTimer()
	s, r := src.dev.Stats(), dst.dev.Stats()
	b.ReportMetric(float64(s.Retransmits)/float64(b.N), "retrans/op")
	// Syscalls of the data direction: sendmmsg on the sender, recvmmsg on
	// the receiver, per 16-packet message.
	b.ReportMetric(float64(s.TxBatches)/float64(b.N), "sendmmsg/op")
	b.ReportMetric(float64(r.RxBatches)/float64(b.N), "recvmmsg/op")
}
