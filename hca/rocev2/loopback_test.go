package rocev2

import (
	"os"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// testLoopback opens a Loopback and closes it at the end of the test.
func testLoopback(t *testing.T, cfg LoopbackConfig) *Loopback {
	t.Helper()
	cfg.Device.MinAckTimeout = 250 * time.Millisecond
	l, err := NewLoopback(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l
}

// checkLoopback runs RC between the first and the last device and a UD
// multicast from the first that every device's attached QP receives.
func checkLoopback(t *testing.T, l *Loopback) {
	t.Helper()
	devs := l.Devices()
	first, last := devs[0], devs[len(devs)-1]
	if first.LocalAddr().Port() != last.LocalAddr().Port() || first.LocalAddr().Addr() == last.LocalAddr().Addr() {
		t.Fatalf("devices on %v and %v: want one port, distinct addresses", first.LocalAddr(), last.LocalAddr())
	}
	a, b := newRCEnd(t, first, rcOpts{}), newRCEnd(t, last, rcOpts{})
	connectRC(t, a, b, rcOpts{}, rcOpts{})
	sendAndCheck(t, a, b, []int{1, 4097, 65520})

	mgid := hca.GID{0xff, 0x12, 0x40, 0x1b}
	ends := make([]*udEnd, len(devs))
	for k, d := range devs {
		ends[k] = newUDEnd(t, d, 2)
		if err := ends[k].qp.AttachMcast(mgid); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ends[k].qp.DetachMcast(mgid) })
	}
	ah, err := first.CreateAH(mgid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ends[0].qp.PostSend([]hca.SendWR{{ID: 9, Data: []byte("hello"), AH: ah, RemoteQPN: hca.QPNMulticast, RemoteQKey: testQKey}}); err != nil {
		t.Fatal(err)
	}
	for k, e := range ends {
		want := 1
		if k == 0 {
			want = 2 // its own send completion too
		}
		for _, wc := range e.cq.wait(t, want) {
			if wc.Opcode == hca.WCRecv && (wc.Status != hca.StatusSuccess || wc.SrcGID != first.Port().GID || string(e.buf[wc.ID][:wc.ByteLen]) != "hello") {
				t.Fatalf("device %d: %+v", k, wc)
			}
		}
	}
}

// TestLoopbackIPv4: N devices on 127.42.0.x in one process, no root.
func TestLoopbackIPv4(t *testing.T) {
	l := testLoopback(t, LoopbackConfig{Devices: 5})
	if got := l.Devices()[4].LocalAddr().Addr().String(); got != "127.42.0.5" {
		t.Fatalf("device 4 on %s", got)
	}
	checkLoopback(t, l)
}

// TestLoopbackIPv6: the same on IPv6 addresses of a private namespace.
func TestLoopbackIPv6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) for a private network namespace with IPv6 addresses on its lo")
	}
	l := testLoopback(t, LoopbackConfig{Devices: 3, IPv6: true})
	if got := l.Devices()[2].LocalAddr().Addr().String(); got != "fd49:504f:4942::3" {
		t.Fatalf("device 2 on %s", got)
	}
	checkLoopback(t, l)
}

func TestLoopbackRejectsBadSizes(t *testing.T) {
	for _, n := range []int{0, 1, MaxLoopbackDevices + 1} {
		if _, err := NewLoopback(LoopbackConfig{Devices: n}); err == nil {
			t.Fatalf("%d devices accepted", n)
		}
	}
}
