package rocev2

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"golang.org/x/sys/unix"
)

// testFabric makes devices on 127.<net>.0.N, all on one UDP port: the
// first device binds port 0 and the kernel's choice becomes the fabric's
// port, so test runs never collide with a real 4791 listener.
type testFabric struct {
	net    byte
	port   uint16
	next   byte
	faults Faults
	devs   []*Device
}

func newTestFabric(t *testing.T, netID byte, faults Faults) *testFabric {
	f := &testFabric{net: netID, next: 1, faults: faults}
	t.Cleanup(func() {
		for _, d := range f.devs {
			if err := d.Close(); err != nil {
				t.Errorf("close %s: %v", d.Name(), err)
			}
		}
	})
	return f
}

func (f *testFabric) config(t *testing.T) Config {
	t.Helper()
	if f.next == 255 {
		t.Fatal("testFabric: out of addresses")
	}
	addr := netip.AddrFrom4([4]byte{127, f.net, 0, f.next})
	f.next++
	if f.port == 0 {
		// Borrow an ephemeral port from the kernel so tests never need
		// 4791 and parallel test processes do not collide.
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
		if err != nil {
			t.Fatal(err)
		}
		f.port = c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
		c.Close()
	}
	faults := f.faults
	faults.Seed += uint64(f.next)
	return Config{
		Bind:          netip.AddrPortFrom(addr, f.port),
		MTU:           hca.MTU4096,
		Faults:        faults,
		MinAckTimeout: 250 * time.Millisecond,
		Name:          fmt.Sprintf("%s/%d", t.Name(), f.next-1),
	}
}

func (f *testFabric) open(t *testing.T, cfg Config) *Device {
	t.Helper()
	for _, d := range f.devs {
		cfg.Peers = append(cfg.Peers, d.LocalAddr().Addr())
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("rocev2.New: %v", err)
	}
	for _, o := range f.devs {
		o.AddPeer(d.LocalAddr().Addr())
	}
	if f.port == 0 {
		f.port = d.LocalAddr().Port()
	}
	f.devs = append(f.devs, d)
	return d
}

func (f *testFabric) newDevice(t *testing.T) *Device { return f.open(t, f.config(t)) }

// listenDF binds an IPv4 UDP socket that sends with DF set from an
// unconnected socket, so with IPv4 ID 0: the ID the ICRCs of packets
// built by wire.AppendFrame cover. A plain socket (IP_PMTUDISC_WANT)
// sends varying IDs, which a device that sees the ID rejects.
func listenDF(t *testing.T, a netip.AddrPort) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(a))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}); err != nil || serr != nil {
		c.Close()
		t.Fatal(err, serr)
	}
	return c
}

// waitCQ is a CQ whose completion handler signals a channel.
type waitCQ struct {
	hca.CQ
	wake chan struct{}
}

func newWaitCQ(t *testing.T, d hca.Device, size int) *waitCQ {
	t.Helper()
	w := &waitCQ{wake: make(chan struct{}, 1)}
	cq, err := d.CreateCQ(hca.CQConfig{Size: size, OnCompletion: func() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	w.CQ = cq
	return w
}

// wait returns exactly n completions; it arms the CQ and polls again when
// Notify reports a missed event, so no wake-up is lost.
func (w *waitCQ) wait(t *testing.T, n int) []hca.WC {
	t.Helper()
	out := make([]hca.WC, 0, n)
	buf := make([]hca.WC, 64)
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for len(out) < n {
		k := w.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if len(out) == n {
			break
		}
		if k > 0 || w.Notify(true) {
			continue
		}
		select {
		case <-w.wake:
		case <-deadline.C:
			t.Fatalf("timed out with %d of %d completions: %+v", len(out), n, out)
		}
	}
	return out
}

type rcEnd struct {
	dev    *Device
	qp     hca.QP
	sendCQ *waitCQ
	recvCQ *waitCQ
}

type rcOpts struct {
	retry, rnrRetry, minRNR, timeout uint8
	srq                              hca.SRQ
	maxSend                          int
}

func newRCEnd(t *testing.T, d *Device, o rcOpts) *rcEnd {
	t.Helper()
	e := &rcEnd{dev: d, sendCQ: newWaitCQ(t, d, 4096), recvCQ: newWaitCQ(t, d, 4096)}
	ms := o.maxSend
	if ms == 0 {
		ms = 256
	}
	qp, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: e.sendCQ.CQ, RecvCQ: e.recvCQ.CQ, SRQ: o.srq,
		MaxSendWR: ms, MaxRecvWR: 1024, Context: fmt.Sprintf("ctx-%s", d.Name())})
	if err != nil {
		t.Fatal(err)
	}
	e.qp = qp
	return e
}

func mustModify(t *testing.T, qp hca.QP, a hca.QPAttr) {
	t.Helper()
	if err := qp.Modify(a); err != nil {
		t.Fatalf("modify %#x to %v: %v", qp.QPN(), a.State, err)
	}
}

// connectRC brings a and b to RTS against each other with PSNs near the
// 24-bit wrap, so every test crosses it.
func connectRC(t *testing.T, a, b *rcEnd, oa, ob rcOpts) {
	t.Helper()
	const psnA, psnB = 0xFFFFF0, 0xFFFFFA
	up := func(x, y *rcEnd, o rcOpts, rq, sq uint32) {
		mustModify(t, x.qp, hca.QPAttr{State: hca.QPStateInit})
		mustModify(t, x.qp, hca.QPAttr{State: hca.QPStateRTR, DestQPN: y.qp.QPN(), DestGID: y.dev.Port().GID,
			RQPSN: rq, PathMTU: hca.MTU4096, MinRNRTimer: o.minRNR})
	}
	up(a, b, oa, psnB, psnA)
	up(b, a, ob, psnA, psnB)
	to := func(o rcOpts) uint8 {
		if o.timeout == 0 {
			return 1
		}
		return o.timeout
	}
	mustModify(t, a.qp, hca.QPAttr{State: hca.QPStateRTS, SQPSN: psnA, Timeout: to(oa), RetryCount: oa.retry, RNRRetry: oa.rnrRetry})
	mustModify(t, b.qp, hca.QPAttr{State: hca.QPStateRTS, SQPSN: psnB, Timeout: to(ob), RetryCount: ob.retry, RNRRetry: ob.rnrRetry})
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>8)
	}
}

// waitRx blocks until d's counters satisfy cond, failing after a
// generous guard timeout.
func (f *testFabric) waitRx(t *testing.T, d *Device, cond func(Stats) bool) {
	t.Helper()
	waitUntil(t, func() bool { return cond(d.Stats()) }, func() string { return fmt.Sprintf("stats %+v", d.Stats()) })
}

// waitUntil re-checks cond, which reads what a device's receive loop
// writes (its counters, its peers), until it holds, and fails after a
// generous guard timeout with what says why.
func waitUntil(t *testing.T, cond func() bool, why func() string) {
	t.Helper()
	guard := time.NewTimer(20 * time.Second)
	defer guard.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-guard.C:
			t.Fatalf("condition not reached; %s", why())
		}
	}
}
