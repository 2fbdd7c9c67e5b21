package ipoibcm

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

func TestUDRecvQueueSizeDefaults(t *testing.T) {
	dev := &soft.Device{}
	host := newMemPort(1, nil)
	for _, tc := range []struct {
		name         string
		recvq, udRQ  int
		wantRQ, want int
	}{
		{"defaults", 0, 0, DefaultRecvQueueSize, DefaultUDRecvQueueSize},
		{"recvq set: the UD ring follows it", 64, 0, 64, 64},
		{"both set", 64, 300, 64, 300},
		{"only the UD ring set", 0, 2048, DefaultRecvQueueSize, 2048},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Config{Device: dev, Host: host, RecvQueueSize: tc.recvq, UDRecvQueueSize: tc.udRQ}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if c.RecvQueueSize != tc.wantRQ || c.UDRecvQueueSize != tc.want {
				t.Fatalf("RecvQueueSize %d, UDRecvQueueSize %d; want %d, %d", c.RecvQueueSize, c.UDRecvQueueSize, tc.wantRQ, tc.want)
			}
		})
	}
	if _, err := (Config{Device: dev, Host: host, UDRecvQueueSize: 2}).withDefaults(); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("UD ring of 2: %v, want ErrInvalidArgument", err)
	}
}

// The UD QP gets UDRecvQueueSize posted buffers and the RX CQ room for all
// of them beside the SRQ: a burst that fills the whole ring while the RX
// poller is stalled loses nothing and overflows no CQ. One datagram more
// finds no receive posted: the port drops it, and the interface counts it
// as rx_ud_no_buffer.
func TestUDRingAbsorbsBurstWhilePollerStalled(t *testing.T) {
	const ring = 40
	fab := soft.NewFabric(soft.Config{})
	t.Cleanup(func() { fab.Close() })
	dev, err := fab.NewDevice("rx")
	if err != nil {
		t.Fatal(err)
	}
	stall := make(chan struct{})
	wrote := make(chan int, ring+1)
	host := newMemPort(1, func(frames [][]byte) {
		<-stall
		wrote <- len(frames)
	})
	ifc, err := New(Config{Device: dev, Host: host, Mode: ModeDatagram, DisableCM: true, RecvQueueSize: 8, UDRecvQueueSize: ring})
	if err != nil {
		t.Fatal(err)
	}
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ifc.Close() })
	release := sync.OnceFunc(func() { close(stall) })
	t.Cleanup(release) // runs before Close: a failed test must not leave the poller stalled
	if len(ifc.ud.bufs) != ring {
		t.Fatalf("UD ring of %d buffers, want %d", len(ifc.ud.bufs), ring)
	}

	sdev, err := fab.NewDevice("tx")
	if err != nil {
		t.Fatal(err)
	}
	scq, err := sdev.CreateCQ(hca.CQConfig{Size: 2 * ring})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := sdev.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: scq, RecvCQ: scq, MaxSendWR: 2 * ring, MaxRecvWR: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []hca.QPAttr{{State: hca.QPStateInit, QKey: frame.QKeyIPoIB}, {State: hca.QPStateRTR}, {State: hca.QPStateRTS}} {
		if err := qp.Modify(a); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := sdev.CreateAH(dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	// An IPv4 packet from an unknown source still passes through the
	// poller to the host (it learns the sender), so each one stalls.
	msg := make([]byte, frame.EncapLen+28)
	frame.PutEncap(msg, frame.EtherTypeIPv4)
	ip := msg[frame.EncapLen:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17 // IPv4, TTL 64, UDP
	binary.BigEndian.PutUint16(ip[2:4], 28)
	copy(ip[12:16], []byte{10, 0, 0, 9})
	copy(ip[16:20], []byte{10, 0, 0, 1})
	before := fab.Stats().UDDrops.NoBuffer
	wrs := make([]hca.SendWR, ring)
	for k := range wrs {
		wrs[k] = hca.SendWR{ID: uint64(k), Data: msg, AH: ah, RemoteQPN: ifc.hw.QPN(), RemoteQKey: frame.QKeyIPoIB}
	}
	if n, err := qp.PostSend(wrs); err != nil || n != ring {
		t.Fatalf("posted %d of %d: %v", n, ring, err)
	}
	if d := fab.Stats().UDDrops.NoBuffer - before; d != 0 {
		t.Fatalf("%d of a %d-packet burst dropped for want of a buffer, want 0", d, ring)
	}
	if n := ifc.Stats().Counters.RxUDNoBuffer; n != 0 {
		t.Fatalf("rx_ud_no_buffer %d after a burst the ring held, want 0", n)
	}
	// One more than the ring while the poller still holds the first batch.
	if _, err := qp.PostSend(wrs[:1]); err != nil {
		t.Fatal(err)
	}
	if d := fab.Stats().UDDrops.NoBuffer - before; d != 1 {
		t.Fatalf("%d dropped after overrunning the ring by one, want 1", d)
	}
	const more = 5
	for range more {
		if _, err := qp.PostSend(wrs[:1]); err != nil {
			t.Fatal(err)
		}
	}
	if d, n := fab.Stats().UDDrops.NoBuffer-before, ifc.Stats().Counters.RxUDNoBuffer; d != 1+more || n != d {
		t.Fatalf("rx_ud_no_buffer %d, the fabric dropped %d for want of a buffer; want both %d", n, d, 1+more)
	}
	release()
	total := 0
	for total < ring {
		total += <-wrote
	}
	if total != ring {
		t.Fatalf("host got %d frames, want %d", total, ring)
	}
	if st := ifc.Stats(); st.Reaper.CQErrors != 0 {
		t.Fatalf("%d CQ errors", st.Reaper.CQErrors)
	}
	qp.Destroy()
	ah.Destroy()
	scq.Destroy()
}
