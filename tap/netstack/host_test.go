package netstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

var (
	_ ipoibcm.HostPort    = (*Host)(nil)
	_ ipoibcm.OffloadPort = (*Host)(nil)
	_ ipoibcm.GatherPort  = (*Host)(nil)
)

func TestPing(t *testing.T) {
	p := newPair(t, Config{})
	ll := header.LinkLocalAddr(p.b.ep.mac).As16()
	for _, tc := range []struct {
		name string
		dst  netip.Addr
		size int
	}{
		{"ipv4", addrB4.Addr(), 56},
		{"ipv4-large", addrB4.Addr(), 1400},
		{"ipv6", addrB6.Addr(), 56},
		{"ipv6-link-local", netip.AddrFrom16(ll), 56},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rtt, err := p.a.Ping(testContext(t), tc.dst, tc.size)
			if err != nil {
				t.Fatalf("Ping %v: %v", tc.dst, err)
			}
			if rtt <= 0 {
				t.Errorf("rtt = %v, want > 0", rtt)
			}
		})
	}
	if c := p.b.Counters(); c.RxPackets == 0 || c.TxPackets == 0 || c.RxDropped() != 0 {
		t.Errorf("B counters after pings: %+v", c)
	}
}

func TestPingTimesOutWithoutLink(t *testing.T) {
	a := newTestHost(t, Config{Addrs: []netip.Prefix{addrA4}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Ping(ctx, addrB4.Addr(), 8); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping with nobody there = %v, want context.Canceled", err)
	}
}

// transfer sends n pattern bytes from src to dst:port over TCP and checks
// every byte on arrival.
func transfer(t *testing.T, src, dst *Host, to netip.AddrPort, n int) {
	t.Helper()
	ctx := testContext(t)
	l, err := dst.ListenTCP(to.Port())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() { done <- receivePattern(l, n) }()

	c, err := src.DialTCP(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := sendPattern(c, n); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func pattern(off int) byte { return byte(off*7 + off>>12) }

func sendPattern(c net.Conn, n int) error {
	buf := make([]byte, 256<<10)
	for off := 0; off < n; {
		chunk := buf[:min(len(buf), n-off)]
		for i := range chunk {
			chunk[i] = pattern(off + i)
		}
		w, err := c.Write(chunk)
		if err != nil {
			return err
		}
		off += w
	}
	return nil
}

func receivePattern(l net.Listener, n int) error {
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	off := 0
	for {
		r, err := c.Read(buf)
		for i := range r {
			if buf[i] != pattern(off+i) {
				return fmt.Errorf("byte mismatch at offset %d", off+i)
			}
		}
		off += r
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if off != n {
		return fmt.Errorf("received %d bytes, want %d", off, n)
	}
	return nil
}

// tcpOptionSlack is what gVisor's sender leaves unused in each full segment:
// it reserves the 40-byte TCP option maximum but sends only the 12-byte
// timestamp option.
const tcpOptionSlack = 40 - 12

func TestTCP64MiB(t *testing.T) {
	size := 64 << 20
	if testing.Short() {
		size = 8 << 20
	}
	for _, tc := range []struct {
		name string
		mtu  int
		gso  bool
		to   netip.Addr
	}{
		{"ipv4-mtu1500", 1500, false, addrB4.Addr()},
		{"ipv6-mtu9000-gso", 9000, true, addrB6.Addr()},
		{"ipv4-mtu65520-gso", 65520, true, addrB4.Addr()},
		// Without GSO, and over IPv6: every received segment is split
		// into a header and a payload chunk (rxBuffer).
		{"ipv4-mtu65520", 65520, false, addrB4.Addr()},
		{"ipv6-mtu65520", 65520, false, addrB6.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, Config{MTU: tc.mtu, GSO: tc.gso})
			transfer(t, p.a, p.b, netip.AddrPortFrom(tc.to, 5001), size)
			maxA := int(p.pa.maxFrame.Load())
			if maxA > tc.mtu+ethernetHeaderLen {
				t.Errorf("largest frame %d exceeds MTU %d + 14", maxA, tc.mtu)
			}
			// Full-sized segments prove the MSS follows the MTU. gVisor
			// leaves room for 40 bytes of TCP options but sends 12.
			if maxA != tc.mtu+ethernetHeaderLen-tcpOptionSlack {
				t.Errorf("largest frame %d, want close to MTU %d + 14", maxA, tc.mtu)
			}
			if c := p.b.Counters(); c.RxBytes < uint64(size) {
				t.Errorf("B received %d bytes of frames, want >= %d", c.RxBytes, size)
			}
		})
	}
}

func TestSetMTUChangesMSS(t *testing.T) {
	p := newPair(t, Config{MTU: 9000})
	transfer(t, p.a, p.b, netip.AddrPortFrom(addrB4.Addr(), 5001), 4<<20)
	if got := p.pa.maxFrame.Load(); got != 9014-tcpOptionSlack {
		t.Fatalf("at MTU 9000 largest frame = %d, want %d", got, 9014-tcpOptionSlack)
	}
	for _, h := range []*Host{p.a, p.b} {
		if err := h.SetMTU(1500); err != nil {
			t.Fatal(err)
		}
	}
	if p.a.MTU() != 1500 {
		t.Fatalf("MTU() = %d after SetMTU(1500)", p.a.MTU())
	}
	p.pa.maxFrame.Store(0)
	p.pb.maxFrame.Store(0)
	transfer(t, p.a, p.b, netip.AddrPortFrom(addrB4.Addr(), 5002), 4<<20)
	if got := p.pa.maxFrame.Load(); got != 1514-tcpOptionSlack {
		t.Fatalf("after SetMTU(1500) largest frame = %d, want %d", got, 1514-tcpOptionSlack)
	}
	if err := p.a.SetMTU(100); err == nil {
		t.Error("SetMTU(100) succeeded, want an error (below IPv6 minimum)")
	}
}

func TestListenTCPDualStack(t *testing.T) {
	p := newPair(t, Config{})
	l, err := p.b.ListenTCP(7)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, to := range []netip.Addr{addrB4.Addr(), addrB6.Addr()} {
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				accepted <- nil
				return
			}
			accepted <- c
		}()
		c, err := p.a.DialTCP(testContext(t), netip.AddrPortFrom(to, 7))
		if err != nil {
			t.Fatalf("dial %v: %v", to, err)
		}
		sc := <-accepted
		if sc == nil {
			t.Fatalf("accept for %v failed", to)
		}
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 5)
		if _, err := io.ReadFull(sc, got); err != nil || string(got) != "hello" {
			t.Fatalf("read %q, %v", got, err)
		}
		c.Close()
		sc.Close()
	}
}

func TestUDP(t *testing.T) {
	p := newPair(t, Config{})
	for _, to := range []netip.Addr{addrB4.Addr(), addrB6.Addr()} {
		t.Run(to.String(), func(t *testing.T) {
			srv, err := p.b.ListenUDP(netip.AddrPortFrom(to, 9))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cl, err := p.a.DialUDP(netip.AddrPortFrom(to, 9))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			msg := bytes.Repeat([]byte{0xa5}, 1200)
			if _, err := cl.Write(msg); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 2000)
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:n], msg) {
				t.Fatalf("got %d bytes, want the 1200 sent", n)
			}
			// Echo back so both directions are covered.
			if _, err := srv.WriteTo(buf[:n], from); err != nil {
				t.Fatal(err)
			}
			n, err = cl.Read(buf)
			if err != nil || !bytes.Equal(buf[:n], msg) {
				t.Fatalf("echo: %d bytes, %v", n, err)
			}
		})
	}
}

func TestMulticast(t *testing.T) {
	p := newPair(t, Config{})
	for _, tc := range []struct {
		group  netip.Addr
		any    netip.Addr
		report func() uint64
	}{
		{netip.MustParseAddr("239.1.2.3"), netip.IPv4Unspecified(),
			func() uint64 {
				sent := p.b.Stack().Stats().IGMP.PacketsSent
				return sent.V2MembershipReport.Value() + sent.V3MembershipReport.Value()
			}},
		{netip.MustParseAddr("ff15::1234"), netip.IPv6Unspecified(),
			func() uint64 {
				sent := p.b.Stack().Stats().ICMP.V6.PacketsSent
				return sent.MulticastListenerReport.Value() + sent.MulticastListenerReportV2.Value()
			}},
	} {
		t.Run(tc.group.String(), func(t *testing.T) {
			before := tc.report()
			if err := p.b.JoinMulticast(tc.group); err != nil {
				t.Fatal(err)
			}
			if after := tc.report(); after <= before {
				t.Errorf("membership reports sent %d -> %d, want an increase on join", before, after)
			}
			srv, err := p.b.ListenUDP(netip.AddrPortFrom(tc.any, 5000))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cl, err := p.a.DialUDP(netip.AddrPortFrom(tc.group, 5000))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if _, err := cl.Write([]byte("to the group")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			n, err := srv.Read(buf)
			if err != nil || string(buf[:n]) != "to the group" {
				t.Fatalf("read %q, %v", buf[:n], err)
			}
			if err := p.b.LeaveMulticast(tc.group); err != nil {
				t.Fatal(err)
			}
		})
	}
	if err := p.b.JoinMulticast(addrA4.Addr()); err == nil {
		t.Error("JoinMulticast(unicast) succeeded")
	}
}

func TestLinkDownDrops(t *testing.T) {
	p := newPair(t, Config{})
	if _, err := p.a.Ping(testContext(t), addrB4.Addr(), 8); err != nil {
		t.Fatal(err)
	}
	if err := p.a.SetLinkUp(false); err != nil {
		t.Fatal(err)
	}
	if p.a.LinkUp() {
		t.Fatal("LinkUp() after SetLinkUp(false)")
	}
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	// The request is dropped synchronously inside Write, so by the time
	// Ping waits the counter has moved; cancel from a watcher of it. A
	// counter has no event: the watcher polls it with a short sleep (so
	// it does not hold a core) and ends with the context either way.
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for p.a.Counters().TxDroppedLinkDown == 0 {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		cancel()
	}()
	_, err := p.a.Ping(ctx, addrB4.Addr(), 8)
	cancel()
	<-watcherDone
	if err == nil {
		t.Fatal("Ping succeeded with link down")
	}
	if c := p.a.Counters(); c.TxDroppedLinkDown == 0 {
		t.Error("echo request not counted in TxDroppedLinkDown")
	}
	// Frames arriving while down are dropped too.
	if _, err := p.a.WriteFrames([][]byte{make([]byte, 60)}); err != nil {
		t.Fatal(err)
	}
	if c := p.a.Counters(); c.RxDroppedLinkDown != 1 {
		t.Errorf("RxDroppedLinkDown = %d, want 1", c.RxDroppedLinkDown)
	}
	if err := p.a.SetLinkUp(true); err != nil {
		t.Fatal(err)
	}
	if _, err := p.a.Ping(testContext(t), addrB4.Addr(), 8); err != nil {
		t.Fatalf("Ping after link up: %v", err)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	// One throwaway host first, so lazily started runtime and gVisor
	// goroutines are in the baseline.
	warm, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	warm.Close()
	base := runtime.NumGoroutine()

	a, err := New(Config{Addrs: []netip.Prefix{addrA4}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Addrs: []netip.Prefix{addrB4}})
	if err != nil {
		t.Fatal(err)
	}
	stop := Link(a, b)
	if _, err := a.Ping(testContext(t), addrB4.Addr(), 8); err != nil {
		t.Fatal(err)
	}
	transfer(t, a, b, netip.AddrPortFrom(addrB4.Addr(), 5001), 1<<20)

	// A reader blocked in ReadFrames must be released by Close.
	readErr := make(chan error, 1)
	go func() {
		bufs, sizes := [][]byte{make([]byte, 1514)}, []int{0}
		for {
			if _, err := b.ReadFrames(bufs, sizes); err != nil {
				readErr <- err
				return
			}
		}
	}()
	stop()
	stop() // idempotent
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-readErr; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ReadFrames after Close = %v, want net.ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := a.WriteFrames([][]byte{make([]byte, 60)}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("WriteFrames after Close = %v, want net.ErrClosed", err)
	}
	if err := a.SetLinkUp(true); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SetLinkUp after Close = %v, want net.ErrClosed", err)
	}
	testutil.WaitGoroutines(t, base)
}

func TestHostPortBasics(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 7}
	h := newTestHost(t, Config{MAC: mac, BatchSize: 16})
	got := h.HostMAC()
	if !bytes.Equal(got, mac) {
		t.Fatalf("HostMAC = %v, want %v", got, mac)
	}
	got[0] = 0xff // the caller's copy must not alias the host's
	if h.HostMAC()[0] != 0x02 {
		t.Fatal("HostMAC returned an alias")
	}
	if h.BatchSize() != 16 {
		t.Fatalf("BatchSize = %d", h.BatchSize())
	}
	x := newTestHost(t, Config{})
	if m := x.HostMAC(); m[0]&0x03 != 0x02 {
		t.Fatalf("default MAC %v is not locally administered unicast", m)
	}
}

func TestConfigRejects(t *testing.T) {
	for name, cfg := range map[string]Config{
		"short MAC":      {MAC: net.HardwareAddr{2, 0, 0}},
		"multicast MAC":  {MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}},
		"MTU too small":  {MTU: 500},
		"MTU too large":  {MTU: 70000},
		"negative queue": {QueueLen: -1},
		"bad CC":         {TCP: TCPOptions{CongestionControl: "bbr"}},
		"buffers":        {TCP: TCPOptions{BufferDefault: 8 << 20, BufferMax: 1 << 20}},
		"negative RTO":   {TCP: TCPOptions{MinRTO: -1}},
		"bad prefix":     {Addrs: []netip.Prefix{{}}},
		"skip tx only":   {SkipTXChecksums: true},
	} {
		if h, err := New(cfg); err == nil {
			h.Close()
			t.Errorf("%s: New succeeded", name)
		}
	}
}
