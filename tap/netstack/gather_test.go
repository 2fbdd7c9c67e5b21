package netstack

import (
	"bytes"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ipoibcm/ipoib/offload"
)

// gatherPort is a host whose frames from the link arrive through
// WriteFramesGather, each cut into up to five pieces at random points (the
// first piece may end inside the headers), as a GRO writer that gathers
// would hand them over, only less tidily.
type gatherPort struct {
	*Host
	mu       sync.Mutex
	rng      *rand.Rand
	pieces   [][]byte
	frames   [][][]byte
	gathered int // frames written in more than one piece
}

func (p *gatherPort) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frames = p.frames[:0]
	for _, f := range frames {
		p.pieces = splitPieces(p.rng, f, p.pieces[:0])
		if len(p.pieces) > 1 {
			p.gathered++
		}
		p.frames = append(p.frames, append([][]byte(nil), p.pieces...))
	}
	return p.WriteFramesGather(p.frames, meta)
}

// splitPieces cuts f into 1 to 5 pieces at random points, appended to dst.
func splitPieces(rng *rand.Rand, f []byte, dst [][]byte) [][]byte {
	cuts := rng.IntN(5)
	for range cuts {
		if len(f) < 2 {
			break
		}
		k := 1 + rng.IntN(len(f)-1)
		dst = append(dst, f[:k])
		f = f[k:]
	}
	return append(dst, f)
}

// TestWriteFramesGatherTCP moves TCP with host GSO into a host that
// receives every frame gathered from pieces: the bytes arrive intact, the
// super frames whole, their partial checksums vouched for, and the stack
// refuses nothing.
func TestWriteFramesGatherTCP(t *testing.T) {
	for _, tc := range []struct {
		name string
		mtu  int
		to   netip.Addr
	}{
		{"ipv4-mtu4092", 4092, addrB4.Addr()},
		{"ipv6-mtu1500", 1500, addrB6.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := Config{MTU: tc.mtu, GSO: true}
			ca, cb := base, base
			ca.Addrs = []netip.Prefix{addrA4, addrA6}
			cb.Addrs = []netip.Prefix{addrB4, addrB6}
			a, err := New(ca)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := New(cb)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			pb := &gatherPort{Host: b, rng: rand.New(rand.NewPCG(1, 2))}
			stop, err := LinkOffloads(a, pb)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			transferSHA(t, a, b, netip.AddrPortFrom(tc.to, 5001), 8<<20)
			stop()
			cb2 := b.Counters()
			if pb.gathered == 0 || cb2.RxGathered != uint64(pb.gathered) || cb2.RxSuperFrames == 0 || cb2.RxCsumVouched < cb2.RxSuperFrames {
				t.Fatalf("%d frames written in pieces, %d gathered, %d super frames, %d checksums vouched: the gather path was not exercised", pb.gathered, cb2.RxGathered, cb2.RxSuperFrames, cb2.RxCsumVouched)
			}
			if cb2.RxDropped() != 0 {
				t.Fatalf("B dropped %d frames: %+v", cb2.RxDropped(), cb2)
			}
			checkStackClean(t, "B", b)
		})
	}
}

// TestWriteFramesGatherOversize: a gathered frame longer than any IP
// packet is dropped and counted before anything is allocated for it.
func TestWriteFramesGatherOversize(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrB4}})
	big := make([]byte, 40000)
	copy(big, h.HostMAC())
	if _, err := h.WriteFramesGather([][][]byte{{big, big}}, []offload.Meta{{}}); err != nil {
		t.Fatal(err)
	}
	if c := h.Counters(); c.RxDroppedOversize != 1 || c.RxPackets != 0 {
		t.Fatalf("oversize gathered frame: %d dropped oversize, %d delivered", c.RxDroppedOversize, c.RxPackets)
	}
}

// rxOutcome is what one received frame did to a host: its counters and
// its stack's verdicts.
type rxOutcome struct {
	packets, bytes, dropped, super, cut, vouched, oversize uint64
	tcpValid, tcpCsum, ipMalformed, udpCsum, udpMalformed  uint64
}

func outcome(h *Host) rxOutcome {
	c, s := h.Counters(), h.Stack().Stats()
	return rxOutcome{
		packets: c.RxPackets, bytes: c.RxBytes, dropped: c.RxDropped(), super: c.RxSuperFrames,
		cut: c.RxResegmented, vouched: c.RxCsumVouched, oversize: c.RxDroppedOversize,
		tcpValid: s.TCP.ValidSegmentsReceived.Value(), tcpCsum: s.TCP.ChecksumErrors.Value(),
		ipMalformed: s.IP.MalformedPacketsReceived.Value(), udpCsum: s.UDP.ChecksumErrors.Value(),
		udpMalformed: s.UDP.MalformedPacketsReceived.Value(),
	}
}

func (o rxOutcome) minus(p rxOutcome) rxOutcome {
	return rxOutcome{
		o.packets - p.packets, o.bytes - p.bytes, o.dropped - p.dropped, o.super - p.super,
		o.cut - p.cut, o.vouched - p.vouched, o.oversize - p.oversize,
		o.tcpValid - p.tcpValid, o.tcpCsum - p.tcpCsum, o.ipMalformed - p.ipMalformed,
		o.udpCsum - p.udpCsum, o.udpMalformed - p.udpMalformed,
	}
}

// FuzzWriteFramesGather writes arbitrary frames with arbitrary metadata,
// cut into pieces at arbitrary points, to one host with WriteFramesGather
// and whole to a twin with WriteFramesMeta: nothing may panic, and both
// must come to the same verdict (delivered, dropped for the same reason,
// checksum vouched for or refused by the stack).
func FuzzWriteFramesGather(f *testing.F) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	tcp := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
	copy(tcp, mac)
	hd, err := offload.SetPartial(tcp, ethernetHeaderLen)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tcp, uint16(hd.End), uint16(1000), uint8(offload.GSOTCPv4), uint16(1448), true, uint16(hd.L4), uint16(16), false)
	f.Add(tcp, uint16(10), uint16(60), uint8(0), uint16(0), true, uint16(hd.L4), uint16(16), false)
	f.Add(tcp, uint16(0), uint16(0), uint8(0), uint16(0), false, uint16(0), uint16(0), true)
	f.Add(tcp, uint16(hd.End), uint16(2000), uint8(offload.GSOUDPL4), uint16(1), true, uint16(34), uint16(6), false)
	twins := make([]*Host, 2)
	for k := range twins {
		h, err := New(Config{MAC: mac, Addrs: []netip.Prefix{addrA4, addrA6}, QueueLen: 8})
		if err != nil {
			f.Fatal(err)
		}
		defer h.Close()
		twins[k] = h
	}
	g, w := twins[0], twins[1]
	f.Fuzz(func(t *testing.T, b []byte, cut1, cut2 uint16, gso uint8, size uint16, needs bool, start, off uint16, valid bool) {
		m := offload.Meta{GSO: offload.GSO(gso), GSOSize: size, NeedsCsum: needs, CsumStart: start, CsumOffset: off, DataValid: valid}
		c1 := min(int(cut1), len(b))
		c2 := min(max(int(cut2), c1), len(b))
		pieces := [][]byte{b[:c1], b[c1:c2], b[c2:]}
		g0, w0 := outcome(g), outcome(w)
		if _, err := g.WriteFramesGather([][][]byte{pieces}, []offload.Meta{m}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteFramesMeta([][]byte{b}, []offload.Meta{m}); err != nil {
			t.Fatal(err)
		}
		if gd, wd := outcome(g).minus(g0), outcome(w).minus(w0); gd != wd {
			t.Fatalf("frame %x in pieces at %d, %d, meta %+v:\ngathered %+v\nwhole    %+v", b, c1, c2, m, gd, wd)
		}
		drain(t, g)
		drain(t, w)
	})
}

// TestRxBufHandsOverGatheredView: the view writeGathered filled becomes
// the packet's buffer itself (no second copy) when the frame delivered is
// its bytes, and stays with writeGathered (to be released) when the frame
// delivered is another copy (a completed checksum, a cut segment).
func TestRxBufHandsOverGatheredView(t *testing.T) {
	var e endpoint
	frame := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
	v := buffer.NewViewWithData(frame)
	e.gathered = v
	other := append([]byte(nil), frame...)
	b := e.rxBuf(other, uint16(header.IPv4ProtocolNumber))
	if e.gathered != v {
		t.Fatal("rxBuf took the gathered view for a frame that is not its bytes")
	}
	b.Release()
	b = e.rxBuf(v.AsSlice(), uint16(header.IPv4ProtocolNumber))
	defer b.Release()
	if e.gathered != nil {
		t.Fatal("rxBuf copied a frame that is the gathered view's bytes")
	}
	if got := b.Flatten(); !bytes.Equal(got, frame) {
		t.Fatalf("buffer holds %d bytes, not the frame's %d", len(got), len(frame))
	}
}
