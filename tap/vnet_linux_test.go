package tap

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// vnetPair is two namespaces, each with a vnet TAP, and the test in the
// middle bridging frames between the two devices.
type vnetPair struct {
	a, b       *Device
	nsA, nsB   *Netns
	addrA      netip.Addr
	addrB      netip.Addr
	superSeen  atomic.Int64 // GSO frames larger than MTU read from a TAP
	badHdr     atomic.Int64 // headers Validate refused
	segmented  atomic.Int64 // ReadFrames calls that returned >1 frame
	wg         sync.WaitGroup
	maxSuperSz atomic.Int64
}

const vnetTestMTU = 1500

func newVnetPair(t *testing.T, v6 bool) *vnetPair {
	requireRoot(t)
	o := testOwner(t)
	p := &vnetPair{nsA: createNetns(t, o, "va"), nsB: createNetns(t, o, "vb")}
	pa, pb := netip.MustParsePrefix("10.77.0.1/24"), netip.MustParsePrefix("10.77.0.2/24")
	if v6 {
		pa, pb = netip.MustParsePrefix("fd77::1/64"), netip.MustParsePrefix("fd77::2/64")
	}
	p.addrA, p.addrB = pa.Addr(), pb.Addr()
	var err error
	p.a, err = Open(Config{Name: "vt0", Netns: p.nsA, VnetHdr: true, Link: LinkConfig{MTU: vnetTestMTU, Addrs: []netip.Prefix{pa}, Up: true}})
	if err != nil {
		t.Fatalf("open a: %v", err)
	}
	p.b, err = Open(Config{Name: "vt0", Netns: p.nsB, VnetHdr: true, Link: LinkConfig{MTU: vnetTestMTU, Addrs: []netip.Prefix{pb}, Up: true}})
	if err != nil {
		p.a.Close()
		t.Fatalf("open b: %v", err)
	}
	t.Cleanup(func() {
		p.a.Close()
		p.b.Close()
		p.wg.Wait()
	})
	if p.a.Offloads()&(OffloadCsum|OffloadTSO4|OffloadTSO6) != OffloadCsum|OffloadTSO4|OffloadTSO6 {
		t.Fatalf("kernel refused TSO on a vnet TAP: offloads %v", p.a.Offloads())
	}
	t.Logf("offloads: %v", p.a.Offloads())
	return p
}

// passthrough bridges from -> to frame by frame with the virtio header as
// the kernel gave it: the offload-capable tap-pipe. It validates every
// header on the way and records the super frames it saw.
func (p *vnetPair) passthrough(from, to *Device) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, vnetMaxFrame)
		for {
			n, h, err := from.ReadPacket(buf)
			if err != nil {
				return
			}
			frame := buf[:n]
			if _, r := h.Validate(frame); r != VnetOK {
				p.badHdr.Add(1)
				continue
			}
			if h.IsGSO() && n > EthHdrLen+vnetTestMTU {
				p.superSeen.Add(1)
				if int64(n) > p.maxSuperSz.Load() {
					p.maxSuperSz.Store(int64(n))
				}
			}
			if err := to.WritePacket(frame, h); err != nil {
				return
			}
		}
	}()
}

// softwareGSO bridges from -> to through the HostPort methods: ReadFrames
// completes checksums and segments super frames in software, WriteFrames
// hands the frames over with an empty header, so the receiving kernel
// checks every checksum we computed.
func (p *vnetPair) softwareGSO(from, to *Device) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		bufs := make([][]byte, from.BatchSize())
		for i := range bufs {
			bufs[i] = make([]byte, EthHdrLen+vnetTestMTU)
		}
		sizes := make([]int, len(bufs))
		frames := make([][]byte, len(bufs))
		for {
			n, err := from.ReadFrames(bufs, sizes)
			if err != nil {
				return
			}
			if n > 1 {
				p.segmented.Add(1)
			}
			for i := range n {
				if sizes[i] > EthHdrLen+vnetTestMTU {
					panic(fmt.Sprintf("segment of %d bytes", sizes[i]))
				}
				frames[i] = bufs[i][:sizes[i]]
			}
			if _, err := to.WriteFrames(frames[:n]); err != nil {
				return
			}
		}
	}()
}

// transfer sends size random bytes over TCP from namespace A to B and
// checks they arrive intact.
func (p *vnetPair) transfer(t *testing.T, size int) {
	t.Helper()
	var ln net.Listener
	if err := p.nsB.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(p.addrB, 0).String())
		return err
	}); err != nil {
		t.Fatalf("listen in B: %v", err)
	}
	defer ln.Close()
	dial := func() (c net.Conn, err error) {
		err = p.nsA.Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: 10 * time.Second}).Dial("tcp", ln.Addr().String())
			return err
		})
		return c, err
	}
	testutil.TCPTransfer(t, ln, dial, size, 90*time.Second)
}

// TestVnetPassthroughTSO: with IFF_VNET_HDR and TSO offered, the host
// hands us TCP super frames far beyond the 1500-byte MTU, with virtio
// headers that validate; written back as they are to another vnet TAP,
// the peer's stack accepts them and the byte stream arrives intact.
func TestVnetPassthroughTSO(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			p := newVnetPair(t, v6)
			p.passthrough(p.a, p.b)
			p.passthrough(p.b, p.a)
			p.transfer(t, 16<<20)
			if p.badHdr.Load() != 0 {
				t.Errorf("%d headers from the kernel failed validation", p.badHdr.Load())
			}
			if p.superSeen.Load() == 0 {
				t.Fatalf("no GSO frame above the %d-byte MTU came from the TAP", vnetTestMTU)
			}
			t.Logf("%d super frames, largest %d bytes", p.superSeen.Load(), p.maxSuperSz.Load())
			for r := VnetDropShort; int(r) < VnetDropReasons; r++ {
				if n := p.a.VnetDrops(r) + p.b.VnetDrops(r); n != 0 {
					t.Errorf("drops %v: %d", r, n)
				}
			}
		})
	}
}

// TestVnetSoftwareGSO: the same flow through ReadFrames/WriteFrames, so
// every super frame is cut by offload.Segment and every checksum is ours;
// the receiving kernel verifies them (an empty virtio header claims
// nothing), so a wrong one would stall the transfer.
func TestVnetSoftwareGSO(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			p := newVnetPair(t, v6)
			p.softwareGSO(p.a, p.b)
			p.softwareGSO(p.b, p.a)
			p.transfer(t, 16<<20)
			if p.segmented.Load() == 0 {
				t.Fatal("no super frame was segmented: the kernel sent no TSO frames")
			}
			if n := p.a.SegmentDrops() + p.b.SegmentDrops(); n != 0 {
				t.Errorf("%d super frames did not fit the batch", n)
			}
		})
	}
}

// TestVnetWritePacketRejectsOversize: a frame larger than any TAP frame is
// one clear error, not a truncated write.
func TestVnetWritePacketRejectsOversize(t *testing.T) {
	p := newVnetPair(t, false)
	err := p.a.WritePacket(make([]byte, vnetMaxFrame+1), VnetHdr{})
	if err == nil || errors.Is(err, net.ErrClosed) {
		t.Fatalf("oversize write: %v", err)
	}
	plain, err := Open(Config{Name: "pt0", Netns: p.nsA})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, _, err := plain.ReadPacket(nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ReadPacket without VnetHdr: %v", err)
	}
	if plain.Offloads() != 0 || plain.BatchSize() != 1 {
		t.Fatalf("plain TAP: offloads %v batch %d", plain.Offloads(), plain.BatchSize())
	}
}

// udpGSOTransfer sends rounds of one 60000-byte UDP_SEGMENT write from A
// to B (USO: the kernel hands the TAP one super frame when it may) and
// checks that B reads each round as 1400-byte datagrams carrying exactly
// the bytes written.
func (p *vnetPair) udpGSOTransfer(t *testing.T, rounds int) {
	t.Helper()
	const seg, size = 1400, 60000
	var rx *net.UDPConn
	if err := p.nsB.Do(func() (err error) {
		rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.addrB, 0)))
		return err
	}); err != nil {
		t.Fatalf("listen in B: %v", err)
	}
	defer rx.Close()
	var tx *net.UDPConn
	if err := p.nsA.Do(func() (err error) {
		tx, err = net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatalf("dial from A: %v", err)
	}
	defer tx.Close()
	testutil.UDPSegmentRounds(t, tx, rx, seg, size, rounds)
}

// TestVnetUSO: UDP segmentation offload through both bridges: passed
// through as USO super frames, and cut by offload.Segment with our UDP
// checksums, which the receiving kernel verifies.
func TestVnetUSO(t *testing.T) {
	for _, mode := range []string{"passthrough", "software"} {
		t.Run(mode, func(t *testing.T) {
			p := newVnetPair(t, false)
			if p.a.Offloads()&OffloadUSO4 == 0 {
				t.Skipf("kernel refused USO on a TAP (offloads %v): needs Linux 6.2", p.a.Offloads())
			}
			if mode == "passthrough" {
				p.passthrough(p.a, p.b)
				p.passthrough(p.b, p.a)
			} else {
				p.softwareGSO(p.a, p.b)
				p.softwareGSO(p.b, p.a)
			}
			p.udpGSOTransfer(t, 20)
			if mode == "passthrough" && p.superSeen.Load() == 0 {
				t.Fatal("no USO super frame came from the TAP")
			}
			if mode == "software" && p.segmented.Load() == 0 {
				t.Fatal("no USO super frame was segmented")
			}
			if p.badHdr.Load() != 0 {
				t.Fatalf("%d headers failed validation", p.badHdr.Load())
			}
		})
	}
}
