package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// partitionPair is two interfaces of partition 0x8001 over one backend,
// with gVisor hosts, captured into file.
type partitionPair struct {
	hosts [2]*netstack.Host
	addrs [2]netip.Addr
	port  uint16 // the RoCEv2 UDP port tshark must decode
}

var partitionTable = []hca.PKey{hca.PKeyDefault, 0x8001}

func startPartitionIfc(t *testing.T, p *partitionPair, i int, dev hca.Device, closeDev func() error) {
	t.Helper()
	p.addrs[i] = netip.AddrFrom4([4]byte{10, 81, 0, byte(i + 1)})
	h, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(p.addrs[i], 24)}, MTU: 65520})
	if err != nil {
		t.Fatal(err)
	}
	p.hosts[i] = h
	ifc, err := ipoibcm.New(ipoibcm.Config{Device: dev, Host: h, Name: "ib0.8001", Mode: ipoibcm.ModeConnected,
		PKey: 0x8001, RCRetry: 6, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errors.Join(ifc.Close(), closeDev()); err != nil {
			t.Errorf("close host %d: %v", i, err)
		}
	})
}

// softPartitionPair runs the pair on a soft fabric, every message
// captured.
func softPartitionPair(t *testing.T, s *Stream) *partitionPair {
	fab := soft.NewFabric(soft.Config{Seed: 81, Tap: s})
	t.Cleanup(func() { fab.Close() })
	p := &partitionPair{port: wire.RoCEv2Port}
	for i := range 2 {
		dev, err := fab.NewDevice(fmt.Sprintf("ipoib-h%d", i+1))
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.SetPKeyTable(partitionTable); err != nil {
			t.Fatal(err)
		}
		startPartitionIfc(t, p, i, dev, dev.Close)
	}
	return p
}

// rocev2PartitionPair runs the pair on two RoCEv2 devices over loopback
// UDP, capturing what the first sends and accepts.
func rocev2PartitionPair(t *testing.T, s *Stream) *partitionPair {
	binds := [2]netip.Addr{netip.MustParseAddr("127.81.0.1"), netip.MustParseAddr("127.81.0.2")}
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(binds[0], 0)))
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	c.Close()
	p := &partitionPair{port: port}
	for i := range 2 {
		cfg := rocev2.Config{Bind: netip.AddrPortFrom(binds[i], port), Peers: []netip.Addr{binds[1-i]},
			PKeys: partitionTable, MinAckTimeout: 20 * time.Millisecond}
		if i == 0 {
			cfg.Tap = s
		}
		dev, err := rocev2.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		startPartitionIfc(t, p, i, dev, dev.Close)
	}
	return p
}

// rocev2MulticastPartitionPair runs the pair on two RoCEv2 devices over
// IPv6 with Config.Multicast, so UD multicast goes to the MGID itself as
// the IPv6 group, as rxe sends it. The devices sit on a veth end (lo has
// no multicast) in a private network namespace entered by this
// goroutine's OS thread, which is never handed back: the sockets, the
// group sockets the interfaces' Start attaches included, live there.
func rocev2MulticastPartitionPair(t *testing.T, s *Stream) *partitionPair {
	addrs := []netip.Addr{netip.MustParseAddr("fd81::1"), netip.MustParseAddr("fd81::2")}
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Skipf("RoCEv2 multicast test needs a private network namespace (CAP_SYS_ADMIN): %v", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "p0", MTU: 9000}, PeerName: "p1"}); err != nil {
		t.Skipf("RoCEv2 multicast test needs veth: %v", err)
	}
	for _, name := range []string{"lo", "p1", "p0"} {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
		if name != "p0" {
			continue
		}
		for _, a := range addrs {
			na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
			if err := h.AddrAdd(l, na); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := &partitionPair{port: wire.RoCEv2Port}
	for i, a := range addrs {
		cfg := rocev2.Config{Bind: netip.AddrPortFrom(a, wire.RoCEv2Port), Multicast: true, PKeys: partitionTable,
			MinAckTimeout: 20 * time.Millisecond, Tap: s}
		var dev *rocev2.Device
		// A fresh IPv6 address is bindable only once its local route is
		// in, a moment after AddrAdd: nothing to wait on but the bind.
		deadline := time.Now().Add(5 * time.Second)
		for dev, err = rocev2.New(cfg); err != nil && time.Now().Before(deadline); dev, err = rocev2.New(cfg) {
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		startPartitionIfc(t, p, i, dev, dev.Close)
	}
	return p
}

// TestPartitionCaptureDecodes captures a connected-mode exchange of an
// interface in partition 0x8001, on the soft fabric and on RoCEv2, and
// reads it back with tshark: every BTH carries P_Key 0x8001 (UD, RC, ACKs
// and the CM's MADs), the CM REQ's Partition Key is 0x8001, the IPoIB ARP
// inside the UD frames decodes, on the soft fabric the broadcast goes to
// the MGID ff12:401b:8001::ffff:ffff (RFC 4391), and nothing is malformed.
func TestPartitionCaptureDecodes(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt-get install tshark)")
	}
	for _, backend := range []string{"soft", "rocev2", "rocev2-multicast"} {
		t.Run(backend, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "p8001.pcapng")
			f, err := os.Create(file)
			if err != nil {
				t.Fatal(err)
			}
			s, err := NewStream(f, StreamConfig{})
			if err != nil {
				t.Fatal(err)
			}
			var p *partitionPair
			switch backend {
			case "soft":
				p = softPartitionPair(t, s)
			case "rocev2":
				p = rocev2PartitionPair(t, s)
			default:
				p = rocev2MulticastPartitionPair(t, s)
			}
			for from := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := p.hosts[from].Ping(ctx, p.addrs[1-from], 8000)
				cancel()
				if err != nil {
					t.Fatalf("ping %v -> %v: %v", p.addrs[from], p.addrs[1-from], err)
				}
			}
			if err := errors.Join(s.Close(), f.Close()); err != nil {
				t.Fatal(err)
			}
			checkPartitionCapture(t, tshark, file, p.port, backend != "rocev2")
		})
	}
}

func checkPartitionCapture(t *testing.T, tshark, file string, port uint16, mgid bool) {
	t.Helper()
	fields := func(filter string, f ...string) [][]string {
		t.Helper()
		return testutil.TsharkFields(t, tshark, []string{"-o", fmt.Sprintf("infiniband.rroce.port:%d", port), "-r", file}, filter, f...)
	}
	pkeys := func(filter, field string) (n int) {
		t.Helper()
		for _, r := range fields(filter, field) {
			v, err := strconv.ParseUint(r[0], 0, 16)
			if err != nil || v != 0x8001 {
				t.Errorf("%s %q in a frame matching %q, want 0x8001", field, r[0], filter)
			}
			n++
		}
		return n
	}
	for _, c := range []struct{ what, filter, field string }{
		{"IB packets", "infiniband", "infiniband.bth.p_key"},
		{"CM MADs", "infiniband.mad", "infiniband.bth.p_key"},
		{"RC SENDs", "infiniband.bth.opcode <= 4", "infiniband.bth.p_key"},
		{"RC ACKs", "infiniband.bth.opcode == 17", "infiniband.bth.p_key"},
		{"UD to the group", "infiniband.bth.opcode == 100 && infiniband.bth.destqp == 0xffffff", "infiniband.bth.p_key"},
		{"CM REQs", "infiniband.cm.req", "infiniband.cm.req.pkey"},
	} {
		if n := pkeys(c.filter, c.field); n == 0 {
			t.Errorf("no %s (%s) in the capture", c.what, c.filter)
		} else {
			t.Logf("%-16s %4d frames, %s 0x8001", c.what, n, c.field)
		}
	}
	if n := len(fields("infiniband.bth.opcode == 100 && arp.hw.type == 32", "frame.number")); n == 0 {
		t.Error("no IPoIB ARP decoded inside the UD frames")
	}
	if mgid {
		if n := len(fields("ipv6.dst == ff12:401b:8001::ffff:ffff && infiniband.bth.destqp == 0xffffff", "frame.number")); n == 0 {
			t.Error("no frame to the broadcast MGID ff12:401b:8001::ffff:ffff")
		}
	}
	if rows := fields("_ws.malformed", "frame.number", "_ws.col.Info"); len(rows) != 0 {
		t.Errorf("%d malformed frames: %v", len(rows), rows)
	}
	// tshark shows the ICRC but never checks it; the P_Key is under it.
	pf, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if rep, err := wire.CheckPcapICRC(pf, port); err != nil || !rep.OK() || rep.Good != rep.RoCEv2 {
		t.Errorf("ICRC: %v %v", rep, err)
	}
}
