package rocev2

import (
	"encoding/binary"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
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

// BenchmarkUDLSO60000 sends 60000-byte TCP super frames as UD LSO work
// requests (15 segments of 4000 bytes each, checksums filled, one GSO
// socket write) over loopback to a UD QP that takes every segment.
func BenchmarkUDLSO60000(b *testing.B) {
	t := &testing.T{}
	f := newTestFabric(t, 41, Faults{})
	defer func() {
		for _, d := range f.devs {
			_ = d.Close()
		}
	}()
	src, dst := newUDEnd(t, f.newDevice(t), 1024), newUDEnd(t, f.newDevice(t), 1024)
	ah, err := src.dev.CreateAH(dst.dev.Port().GID)
	if err != nil {
		b.Fatal(err)
	}
	const mss, segs = 4000, 15
	msg := tcpSuperFrame(segs * mss)
	wr := []hca.SendWR{{Data: msg, AH: ah, RemoteQPN: dst.qp.QPN(), RemoteQKey: testQKey, MSS: mss, Flags: hca.SendIPCsum}}
	wcs := make([]hca.WC, 64)
	repost := make([]hca.RecvWR, 1)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	posted, received := 0, 0
	for received < b.N*segs {
		for posted < b.N && posted*segs-received < 512 {
			if _, err := src.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
			src.cq.Poll(wcs)
		}
		n := dst.cq.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Status != hca.StatusSuccess {
				b.Fatalf("recv %+v", wc)
			}
			repost[0] = hca.RecvWR{ID: wc.ID, Buf: dst.buf[wc.ID]}
			if _, err := dst.qp.PostRecv(repost); err != nil {
				b.Fatal(err)
			}
		}
		received += n
		if n == 0 && !dst.cq.Notify(true) {
			<-dst.cq.wake
		}
	}
	b.StopTimer()
	if s := dst.dev.Stats(); s.Drops != [len(s.Drops)]uint64{} {
		b.Fatalf("drops %+v", s)
	}
}

// tcpSuperFrame is an IPoIB-framed IPv4 TCP packet with n payload bytes
// and a partial checksum, as the engine posts for UD LSO.
func tcpSuperFrame(n int) []byte {
	msg := make([]byte, hca.OffloadL3Offset+40+n)
	binary.BigEndian.PutUint16(msg, 0x0800)
	ip := msg[hca.OffloadL3Offset:]
	ip[0], ip[8], ip[9] = 0x45, 64, offload.ProtoTCP
	binary.BigEndian.PutUint16(ip[2:], uint16(40+n))
	copy(ip[12:], []byte{10, 1, 0, 1, 10, 1, 0, 2})
	ip[32] = 5 << 4
	ip[33] = 0x18
	fill(ip[40:], 9)
	return msg
}
