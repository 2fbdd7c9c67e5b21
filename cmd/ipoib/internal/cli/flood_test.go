package cli

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
	"golang.org/x/sys/unix"
)

// upNode is one 'ipoib up' built in-process exactly as runUp configures
// it (upDeviceConfig, upInterfaceConfig), with a gVisor host in place of
// the TAP.
type upNode struct {
	host *netstack.Host
	dev  *rocev2.Device
	ifc  *ipoibcm.Interface
	ip   netip.Addr
}

// upDefaults are the 'ipoib up' flag defaults.
func upDefaults(bind netip.AddrPort, peers []netip.Addr) UpOptions {
	return UpOptions{
		Dev: "ib0", HCA: "rocev2", Bind: bind, Peers: peers, Multicast: true, Mode: "connected", IBMTU: 4096,
		RCRetry: 6, AckTimeout: 50 * time.Millisecond, UDPOffload: true,
		MaxRXConns: 2048, MaxRXConnsPerPeer: 4, MaxHalfOpen: 256,
	}
}

func startUpNode(t *testing.T, o UpOptions, ip netip.Addr) *upNode {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	n := &upNode{ip: ip}
	h, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(ip, 24)}, MTU: 65520})
	if err != nil {
		t.Fatal(err)
	}
	n.host = h
	dcfg, err := upDeviceConfig(o, log)
	if err != nil {
		t.Fatal(err)
	}
	if n.dev, err = rocev2.New(dcfg); err != nil {
		t.Fatal(err)
	}
	mode, err := ipoibcm.ParseMode(o.Mode)
	if err != nil {
		t.Fatal(err)
	}
	if n.ifc, err = ipoibcm.New(upInterfaceConfig(o, mode, n.dev, h, log)); err != nil {
		t.Fatal(err)
	}
	if err := n.ifc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errors.Join(n.ifc.Close(), n.dev.Close()); err != nil {
			t.Errorf("close %v: %v", o.Bind, err)
		}
	})
	return n
}

func (n *upNode) ping(ctx context.Context, to netip.Addr) error {
	_, err := n.host.Ping(ctx, to, 56)
	return err
}

// reqFlooder sends well-formed IPoIB-CM REQs (valid ICRC, the victim's
// service ID, random comm IDs, TIDs and QPNs) from many loopback
// addresses on the fabric port, and counts what comes back to them.
type reqFlooder struct {
	socks   []*net.UDPConn
	srcs    []netip.AddrPort
	dst     netip.AddrPort
	service uint64
	rng     *rand.Rand
	mad     [cm.MADSize]byte

	sent, sentBytes atomic.Uint64
	gotPackets      atomic.Uint64
	gotBytes        atomic.Uint64
	wg              sync.WaitGroup
}

func newREQFlooder(t *testing.T, sources int, dst netip.AddrPort, service uint64) *reqFlooder {
	t.Helper()
	f := &reqFlooder{dst: dst, service: service, rng: rand.New(rand.NewPCG(12, 1))}
	for k := range sources {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 78, 1, byte(1 + k)}), dst.Port())
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(src))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadBuffer(4 << 20)
		// DF from an unconnected socket: IPv4 ID 0, the ID the REQs'
		// ICRCs (wire.AppendFrame) cover. The device sees the ID.
		if raw, err := c.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			})
		}
		f.socks = append(f.socks, c)
		f.srcs = append(f.srcs, src)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			buf := make([]byte, 9000)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				f.gotPackets.Add(1)
				f.gotBytes.Add(uint64(n))
			}
		}()
	}
	t.Cleanup(f.close)
	return f
}

func (f *reqFlooder) close() {
	for _, c := range f.socks {
		c.Close()
	}
	f.wg.Wait()
}

// send sends one REQ from source k.
func (f *reqFlooder) send(t *testing.T, k int) {
	src := f.srcs[k]
	r := cm.REQ{
		TransactionID:           f.rng.Uint64(),
		LocalCommID:             f.rng.Uint32() | 1,
		ServiceID:               f.service,
		LocalCAGUID:             f.rng.Uint64(),
		LocalQPN:                hca.QPN(f.rng.Uint32() & 0xFFFFFF),
		ResponderResources:      4,
		RemoteCMResponseTimeout: 20,
		StartingPSN:             f.rng.Uint32() & 0xFFFFFF,
		LocalCMResponseTimeout:  20,
		PKey:                    0xFFFF,
		PathMTU:                 hca.MTU4096,
		MaxCMRetries:            15,
		SRQ:                     true,
		Primary: cm.Path{
			LocalGID: hca.GIDFromAddr(src.Addr()), RemoteGID: hca.GIDFromAddr(f.dst.Addr()),
			HopLimit: 64, SubnetLocal: true, LocalACKTimeout: 14,
		},
	}
	binary.BigEndian.PutUint32(r.PrivateData[0:], f.rng.Uint32()&0xFFFFFF) // UD QPN
	binary.BigEndian.PutUint32(r.PrivateData[4:], 65524)
	if err := r.Marshal(f.mad[:]); err != nil {
		t.Fatal(err)
	}
	pkt := wire.AppendPacket(nil, &wire.PacketSpec{
		BTH:     wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xFFFF, DestQP: uint32(hca.QPNGSI), PSN: f.rng.Uint32() & 0xFFFFFF},
		DETH:    wire.DETH{QKey: uint32(hca.QKeyGSI), SrcQP: uint32(hca.QPNGSI)},
		Payload: f.mad[:],
	})
	frame, err := wire.AppendFrame(nil, src, f.dst, pkt, false)
	if err != nil {
		t.Fatal(err)
	}
	dgram := frame[wire.IPv4HeaderLen+wire.UDPHeaderLen:]
	if _, err := f.socks[k].WriteToUDPAddrPort(dgram, f.dst); err != nil {
		t.Fatal(err)
	}
	f.sent.Add(1)
	f.sentBytes.Add(uint64(len(dgram)))
}

// memSample is the process's memory at one moment.
type memSample struct {
	heapInuse, rss uint64
}

func sampleMem(gc bool) memSample {
	if gc {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heapInuse: ms.HeapInuse, rss: vmRSS()}
}

// vmRSS reads VmRSS from /proc/self/status in bytes; 0 if unreadable.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

const mib = 1 << 20

// Flood bounds, stated: the engine's passive state is at most
// max-rx-conns QPs and max-half-open handshakes whatever the REQ rate,
// so the live heap may grow by their cost and no more, and the resident
// set grows far less than the 96 MB that 20,000 REQs added before the
// limits.
const (
	floodREQs        = 100000
	floodSources     = 64
	floodWindow      = 512 // REQs in flight beyond what the victim has read
	floodHeapGrowth  = 32 * mib
	floodRSSGrowth   = 64 * mib
	floodAmplifyRate = 2
)

// TestUpREQFlood floods one 'ipoib up' (in-process, real UDP sockets on
// loopback) with 100,000 well-formed REQs from 64 source addresses, never
// answering a REP, while a legitimate peer connects and pings. The
// victim's memory stays bounded, what it sends to the flood's sources is
// at most twice what they sent, the peer connects and pings during and
// after, and the counters explain every REQ.
func TestUpREQFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("the flood takes tens of seconds")
	}
	binds := [2]netip.Addr{netip.MustParseAddr("127.78.0.1"), netip.MustParseAddr("127.78.0.2")}
	port := borrowPort(t, binds[0])
	vb, pb := netip.AddrPortFrom(binds[0], port), netip.AddrPortFrom(binds[1], port)
	// Default --allow: the peers and 127.0.0.0/8, which holds the flood's
	// sources too; only the limits stand between them and the engine.
	victim := startUpNode(t, upDefaults(vb, []netip.Addr{binds[1]}), netip.MustParseAddr("10.78.0.1"))
	peer := startUpNode(t, upDefaults(pb, []netip.Addr{binds[0]}), netip.MustParseAddr("10.78.0.2"))

	fl := newREQFlooder(t, floodSources, vb, 0x1000000000000000|uint64(victim.ifc.HWAddr().QPN()))
	before := sampleMem(true)
	peak := before

	// The legitimate peer connects and pings while the flood runs.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type during struct {
		err         error
		established uint64
		sentAtStart uint64
		sentAtDone  uint64
		took        time.Duration
	}
	startPeer, peerDone := make(chan struct{}), make(chan during, 1)
	go func() {
		<-startPeer
		d := during{sentAtStart: fl.sent.Load()}
		t0 := time.Now()
		for range 5 {
			pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
			d.err = peer.ping(pctx, victim.ip)
			pcancel()
			if d.err != nil {
				break
			}
		}
		d.established = peer.ifc.Stats().Reaper.TXEstablished
		d.sentAtDone, d.took = fl.sent.Load(), time.Since(t0)
		peerDone <- d
	}()

	// At least floodREQs, and on until the peer is done, so everything
	// it does happens under the flood (its REQ may wait for a retry: the
	// flood fills the victim's GSI receive queue).
	start := time.Now()
	var d during
	peerFinished := false
	for i := 0; i < floodREQs || !peerFinished; i++ {
		if i == floodREQs/4 {
			close(startPeer)
		}
		if !peerFinished {
			select {
			case d = <-peerDone:
				peerFinished = true
			default:
			}
		}
		fl.send(t, i%floodSources)
		if i%128 != 127 {
			continue
		}
		// Keep at most floodWindow REQs beyond what the victim's socket
		// has taken: the flood runs as fast as the victim reads, faster
		// than its CM answers (the GSI receive queue overflows, counted
		// no_buffer), and the kernel's socket drops stay countable.
		stall := time.Now().Add(30 * time.Second)
		for {
			s := victim.dev.Stats()
			if s.RxPackets+s.SocketDrops+floodWindow >= fl.sent.Load() {
				break
			}
			if time.Now().After(stall) {
				t.Fatalf("the victim stopped reading: %d REQs sent, %d received, %d socket drops", fl.sent.Load(), s.RxPackets, s.SocketDrops)
			}
			runtime.Gosched()
		}
		if i%8192 == 8191 {
			// Live heap (after a GC) and resident set.
			m := sampleMem(true)
			peak.heapInuse, peak.rss = max(peak.heapInuse, m.heapInuse), max(peak.rss, m.rss)
		}
	}
	floodTime := time.Since(start)
	total := fl.sent.Load()
	if d.err != nil {
		t.Fatalf("legitimate peer during the flood: %v", d.err)
	}
	if d.established == 0 {
		t.Fatalf("the peer's pings went over UD: no RC connection established during the flood")
	}
	t.Logf("legitimate peer: connected and pinged 5 times in %v, between REQ %d and %d of the flood",
		d.took.Round(time.Millisecond), d.sentAtStart, d.sentAtDone)

	// Every handshake the flood opened ends on its own (two response
	// timeouts), and its passive QP is reaped.
	waitFor(t, 30*time.Second, "flood handshakes to end and their QPs to be reaped", func() bool {
		s := victim.ifc.Stats()
		return s.CM.HalfOpen == 0 && s.RXLimits.Conns == 1
	})
	after := sampleMem(true)

	// After the flood: the peer's connection still carries pings.
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	defer pcancel()
	if err := peer.ping(pctx, victim.ip); err != nil {
		t.Fatalf("legitimate peer after the flood: %v", err)
	}
	if err := victim.ping(pctx, peer.ip); err != nil {
		t.Fatalf("victim to peer after the flood: %v", err)
	}

	vs, ps, ds := victim.ifc.Stats(), peer.ifc.Stats(), victim.dev.Stats()
	c := vs.CM
	var outcomes uint64
	for _, n := range c.REQs {
		outcomes += n
	}
	legitREQs := ps.CM.Sent[cm.MsgREQ]
	r := vs.RXLimits
	rxExplained := vs.Reaper.RXAccepted + vs.Reaper.RXRejectedNoQP + r.RejectedLimit + r.RejectedGIDLimit + r.RejectedDown + r.RejectedError
	t.Logf("flood: %d REQs (%d bytes) from %d sources in %v (%.0f REQ/s); legitimate peer sent %d REQs",
		fl.sent.Load(), fl.sentBytes.Load(), floodSources, floodTime.Round(time.Millisecond), float64(total)/floodTime.Seconds(), legitREQs)
	t.Logf("memory: heap in use %d MiB before, %d MiB peak, %d MiB after; RSS %d MiB before, %d MiB peak, %d MiB after",
		before.heapInuse/mib, peak.heapInuse/mib, after.heapInuse/mib, before.rss/mib, peak.rss/mib, after.rss/mib)
	t.Logf("victim CM: received %v, sent %v, REQ outcomes %v, REJ sent %v", c.Received, c.Sent, c.REQs, c.RejSent)
	t.Logf("victim CM: half-open evicted %d, unverified give-ups %d, suppressed %d, retries %d",
		c.HalfOpenEvicted, c.UnverifiedGiveUps, c.UnverifiedSuppressed, c.Retries)
	t.Logf("victim passive conns: accepted %d, %+v", vs.Reaper.RXAccepted, r)
	t.Logf("victim device: rx %d, socket drops %d, no GSI buffer %d, all drops %d",
		ds.RxPackets, ds.SocketDrops, ds.Dropped(wire.DropNoBuffer), ds.TotalDropped())
	t.Logf("to the flood's sources: %d datagrams, %d bytes (%.2fx the bytes they sent)",
		fl.gotPackets.Load(), fl.gotBytes.Load(), float64(fl.gotBytes.Load())/float64(fl.sentBytes.Load()))

	// Every REQ explained. Before the CM handles them, datagrams are
	// dropped and counted by the kernel (socket full), the device (GSI
	// receive queue full, no_buffer) or the CM's per-source backlog,
	// none of which tells a REQ from the peer's
	// other MADs; so the MADs balance exactly (all of them are well
	// formed), and every REQ the CM received is under one outcome.
	lost := ds.SocketDrops + ds.Dropped(wire.DropNoBuffer) + c.Dropped[cm.DropBacklog]
	var peerMADs, received uint64
	for _, n := range ps.CM.Sent {
		peerMADs += n
	}
	for _, n := range c.Received {
		received += n
	}
	if received+lost != total+peerMADs {
		t.Errorf("MADs: %d sent (%d flood REQs + %d from the peer), %d counted lost before the CM, %d received",
			total+peerMADs, total, peerMADs, lost, received)
	}
	if outcomes != c.Received[cm.MsgREQ] || c.Received[cm.MsgREQ] > total+legitREQs {
		t.Errorf("REQs: %d sent (%d flood + %d peer), %d received, %d under an outcome",
			total+legitREQs, total, legitREQs, c.Received[cm.MsgREQ], outcomes)
	}
	if rxExplained != c.REQs[cm.REQToListener] {
		t.Errorf("%d REQs handed to the engine, %d accepted or rejected with a counted reason", c.REQs[cm.REQToListener], rxExplained)
	}
	// No amplification: at most two MADs per REQ, measured where they
	// arrive.
	if got, limit := fl.gotBytes.Load(), floodAmplifyRate*fl.sentBytes.Load(); got > limit {
		t.Errorf("sent %d bytes to sources that never answered, limit %d", got, limit)
	}
	if c.Sent[cm.MsgREP] > floodAmplifyRate*c.Received[cm.MsgREQ] {
		t.Errorf("%d REPs for %d REQs", c.Sent[cm.MsgREP], c.Received[cm.MsgREQ])
	}
	// Memory bounded whatever the REQ count.
	if peak.heapInuse > before.heapInuse+floodHeapGrowth || !raceEnabled && peak.rss > before.rss+floodRSSGrowth {
		t.Errorf("memory: heap %d -> %d MiB (bound +%d), RSS %d -> %d MiB (bound +%d)",
			before.heapInuse/mib, peak.heapInuse/mib, floodHeapGrowth/mib, before.rss/mib, peak.rss/mib, floodRSSGrowth/mib)
	}
	if n := len(victim.dev.Members()); n > floodSources+2 {
		t.Errorf("broadcast group of %d members", n)
	}
}

// waitFor polls cond until it holds; the engine reports these states
// only through its statistics.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		<-tick.C
	}
}
