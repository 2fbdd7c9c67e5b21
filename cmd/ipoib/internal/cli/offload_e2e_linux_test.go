package cli

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap"
)

// offloadLink is two namespaces, each with ib0 as a vnet kernel TAP (the
// way 'ipoib fabric' and 'ipoib up' open it) in front of an engine, the
// engines joined by the soft fabric or by RoCEv2 over loopback UDP.
type offloadLink struct {
	ns   [2]*tap.Netns
	ifc  [2]*ipoibcm.Interface
	v4   [2]netip.Addr
	v6   [2]netip.Addr
	devs [2]*tap.Device
}

// newOffloadLink builds the link; loss is RoCEv2's injected datagram loss.
func newOffloadLink(t *testing.T, backend string, mode ipoibcm.Mode, loss float64) *offloadLink {
	t.Helper()
	testutil.NeedRoot(t)
	l := &offloadLink{}
	owner := &tap.Owner{MarkerDir: t.TempDir()}
	log := slog.New(slog.DiscardHandler)
	var hcas [2]hca.Device
	switch backend {
	case "soft":
		fab := soft.NewFabric(soft.Config{Seed: 5})
		t.Cleanup(func() { fab.Close() })
		for i := range 2 {
			d, err := fab.NewDevice(fmt.Sprintf("hca%d", i))
			if err != nil {
				t.Fatal(err)
			}
			hcas[i] = d
		}
	case "rocev2":
		binds := [2]netip.Addr{netip.MustParseAddr("127.77.11.1"), netip.MustParseAddr("127.77.11.2")}
		port := borrowPort(t, binds[0])
		for i := range 2 {
			d, err := rocev2.New(rocev2.Config{Bind: netip.AddrPortFrom(binds[i], port), Peers: []netip.Addr{binds[1-i]},
				Faults: rocev2.Faults{Seed: uint64(20 + i), Drop: loss}, MinAckTimeout: 20 * time.Millisecond, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			hcas[i] = d
		}
	}
	for i := range 2 {
		ns, err := owner.Create(fmt.Sprintf("ipoib-o%d-%d", os.Getpid()%100000, i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := ns.Delete(); err != nil {
				t.Errorf("delete %s: %v", ns.Name(), err)
			}
		})
		l.ns[i] = ns
		l.v4[i] = netip.AddrFrom4([4]byte{10, 77, 11, byte(i + 1)})
		l.v6[i] = netip.MustParseAddr(fmt.Sprintf("fd77:11::%d", i+1))
		dev, err := tap.Open(tap.Config{Name: "ib0", Netns: ns, VnetHdr: true,
			Link: tap.LinkConfig{Addrs: []netip.Prefix{netip.PrefixFrom(l.v4[i], 24), netip.PrefixFrom(l.v6[i], 64)}}})
		if err != nil {
			t.Fatal(err)
		}
		l.devs[i] = dev
		ifc, err := ipoibcm.New(ipoibcm.Config{Device: hcas[i], Host: dev, Name: "ib0", Mode: mode, RCRetry: 6, Logger: log})
		if err != nil {
			dev.Close()
			t.Fatal(err)
		}
		if err := ifc.Start(); err != nil {
			dev.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ifc.Close()
			dev.Close()
		})
		l.ifc[i] = ifc
	}
	return l
}

// transfer sends size random bytes over TCP from namespace 0 to 1 at
// dst and checks their SHA-256; it returns the elapsed time.
func (l *offloadLink) transfer(t *testing.T, dst netip.Addr, size int) time.Duration {
	t.Helper()
	var ln net.Listener
	if err := l.ns[1].Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, 0).String())
		return err
	}); err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	dial := func() (c net.Conn, err error) {
		err = l.ns[0].Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: 20 * time.Second}).Dial("tcp", ln.Addr().String())
			return err
		})
		return c, err
	}
	return testutil.TCPTransfer(t, ln, dial, size, 5*time.Minute)
}

// udpSegments sends rounds of one 60000-byte UDP_SEGMENT write (USO: the
// kernel hands ib0 one super frame) from namespace 0 to 1 and checks that
// each arrives as 1400-byte datagrams carrying exactly the bytes written.
// Datagram loss on the fabric would show as a short read; the test's
// links for it have none.
func (l *offloadLink) udpSegments(t *testing.T, rounds int) {
	t.Helper()
	const seg, size = 1400, 60000
	var rx, tx *net.UDPConn
	if err := l.ns[1].Do(func() (err error) {
		rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.v4[1], 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := rx.SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	if err := l.ns[0].Do(func() (err error) {
		tx, err = net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	testutil.UDPSegmentRounds(t, tx, rx, seg, size, rounds)
}

// TestOffloadE2E: 256 MiB over ib0 with SHA-256 equality, IPv4 and IPv6,
// in both modes, on the soft fabric and on RoCEv2 with 1% of the
// datagrams lost, through kernel vnet TAPs: the host's TSO super frames
// go out as UD LSO work requests in datagram mode, partial checksums ride
// SendIPCsum, and the other side hands the verdict up. Under the race
// detector each transfer is 32 MiB (its shadow memory makes the engine
// several times slower); CI runs this test without it too (.ci/run).
func TestOffloadE2E(t *testing.T) {
	size := 256 << 20
	if raceEnabled {
		size = 32 << 20
	}
	for _, backend := range []string{"soft", "rocev2"} {
		for _, mode := range []ipoibcm.Mode{ipoibcm.ModeDatagram, ipoibcm.ModeConnected} {
			t.Run(fmt.Sprintf("%s/%s", backend, mode), func(t *testing.T) {
				loss := 0.0
				if backend == "rocev2" {
					loss = 0.01
				}
				l := newOffloadLink(t, backend, mode, loss)
				for _, fam := range []string{"ipv4", "ipv6"} {
					dst := l.v4[1]
					if fam == "ipv6" {
						dst = l.v6[1]
					}
					el := l.transfer(t, dst, size)
					t.Logf("%s: %d MiB in %v (%.2f Gbit/s)", fam, size>>20, el.Round(time.Millisecond), float64(size)*8/el.Seconds()/1e9)
				}
				tx, rx := l.ifc[0].Stats().Offloads, l.ifc[1].Stats().Offloads
				t.Logf("sender offloads %+v", tx)
				t.Logf("receiver offloads %+v", rx)
				if tx.TxGSOFrames != 0 && mode == ipoibcm.ModeConnected {
					t.Logf("%d super frames in connected mode (queued before the host heard TSO is off)", tx.TxGSOFrames)
				}
				switch {
				case mode == ipoibcm.ModeDatagram && tx.TxLSOWRs == 0:
					t.Fatal("datagram mode: no UD LSO work request posted: the host's TSO super frames did not reach the HCA")
				case mode == ipoibcm.ModeConnected && tx.TxCsumHW == 0:
					t.Fatal("connected mode: no send with SendIPCsum: partial checksums did not reach the HCA")
				case backend == "soft" && rx.RxCsumPartial == 0:
					t.Fatal("soft fabric: no partial checksum handed to the receiving host")
				case backend == "rocev2" && mode == ipoibcm.ModeDatagram && rx.RxCsumOK == 0:
					t.Fatal("rocev2 datagram mode: no verified checksum handed to the receiving host")
				case mode == ipoibcm.ModeDatagram && rx.RxGROFrames == 0:
					t.Fatal("datagram mode: nothing coalesced (GRO) toward the receiving host")
				}
				if d := l.ifc[0].Drop("tx_bad_offload") + l.devs[0].VnetDrops(tap.VnetDropCsumOffset); d != 0 {
					t.Fatalf("%d frames from the kernel refused as lying", d)
				}
			})
		}
	}
}

// TestOffloadE2EUSO: UDP super frames (USO, UDP_SEGMENT) from the kernel
// cross ib0 in datagram mode as UD LSO work requests and arrive as the
// datagrams written, byte for byte, on both backends (no loss injected:
// a lost UDP datagram is not the offload's fault).
func TestOffloadE2EUSO(t *testing.T) {
	for _, backend := range []string{"soft", "rocev2"} {
		t.Run(backend, func(t *testing.T) {
			l := newOffloadLink(t, backend, ipoibcm.ModeDatagram, 0)
			if l.devs[0].Offloads()&tap.OffloadUSO4 == 0 {
				t.Skipf("kernel refused USO on a TAP (offloads %v): needs Linux 6.2", l.devs[0].Offloads())
			}
			before := l.ifc[0].Stats().Offloads.TxLSOWRs
			l.udpSegments(t, 20)
			if o := l.ifc[0].Stats().Offloads; o.TxLSOWRs == before {
				t.Fatalf("no UD LSO work request for the USO super frames: %+v", o)
			}
		})
	}
}
