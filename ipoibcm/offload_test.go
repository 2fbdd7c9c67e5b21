package ipoibcm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// metaFrame is a frame with its offload metadata.
type metaFrame struct {
	b []byte
	m offload.Meta
}

// metaPort is an in-memory OffloadPort: frames pushed on in (with their
// Meta) are read by the engine; frames the engine writes are copied to out
// with theirs. It records every SetOffloads.
type metaPort struct {
	mac    net.HardwareAddr
	in     chan metaFrame
	out    chan metaFrame
	accept offload.Caps
	closed chan struct{}
	once   sync.Once

	// sink, when set, takes written frames instead of out (it must not
	// keep them): the benchmarks count without copying.
	sink func(frames [][]byte, meta []offload.Meta)

	mu  sync.Mutex
	set []offload.Caps
}

func newMetaPort(mac byte, accept offload.Caps) *metaPort {
	return &metaPort{
		mac: net.HardwareAddr{0x02, 0, 0, 0, 0xee, mac}, in: make(chan metaFrame, 1024), out: make(chan metaFrame, 4096),
		accept: accept, closed: make(chan struct{}),
	}
}

func (p *metaPort) ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	var f metaFrame
	select {
	case f = <-p.in:
	case <-p.closed:
		return 0, fmt.Errorf("meta port: %w", net.ErrClosed)
	}
	n := 0
	for {
		sizes[n], meta[n] = copy(bufs[n], f.b), f.m
		n++
		if n == len(bufs) {
			return n, nil
		}
		select {
		case f = <-p.in:
		default:
			return n, nil
		}
	}
}

func (p *metaPort) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	panic("the engine must read an OffloadPort with ReadFramesMeta")
}

func (p *metaPort) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	if p.sink != nil {
		p.sink(frames, meta)
		return len(frames), nil
	}
	for k, f := range frames {
		if !p.accept.Accepts(meta[k]) {
			return k, fmt.Errorf("meta port: frame with %+v not accepted", meta[k])
		}
		select {
		case p.out <- metaFrame{b: bytes.Clone(f), m: meta[k]}:
		default:
			return k, fmt.Errorf("meta port: out full")
		}
	}
	return len(frames), nil
}

// gatherPort is a metaPort that also takes frames in pieces (a
// GatherPort, as the vnet TAP): it joins each and passes it on as
// WriteFramesMeta would, counting frames that came in more than one piece;
// with vecSink set it hands the pieces to it instead.
type gatherPort struct {
	*metaPort
	pieced  atomic.Int64
	vecSink func(frames [][][]byte, meta []offload.Meta)
}

var _ GatherPort = (*gatherPort)(nil)

func (p *gatherPort) WriteFramesGather(frames [][][]byte, meta []offload.Meta) (int, error) {
	if p.vecSink != nil {
		p.vecSink(frames, meta)
		return len(frames), nil
	}
	for k, pieces := range frames {
		if len(pieces) > 1 {
			p.pieced.Add(1)
		}
		if n, err := p.WriteFramesMeta([][]byte{bytes.Join(pieces, nil)}, meta[k:k+1]); n != 1 {
			return k, err
		}
	}
	return len(frames), nil
}

func (p *metaPort) WriteFrames(frames [][]byte) (int, error) {
	return p.WriteFramesMeta(frames, make([]offload.Meta, len(frames)))
}

func (p *metaPort) HostOffloads() offload.Caps { return p.accept }

func (p *metaPort) SetOffloads(want offload.Caps) (offload.Caps, error) {
	p.mu.Lock()
	p.set = append(p.set, want)
	p.mu.Unlock()
	return want, nil
}

func (p *metaPort) lastSet() offload.Caps {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.set) == 0 {
		return offload.Caps{}
	}
	return p.set[len(p.set)-1]
}

func (p *metaPort) BatchSize() int            { return 64 }
func (p *metaPort) HostMAC() net.HardwareAddr { return p.mac }
func (p *metaPort) SetMTU(int) error          { return nil }
func (p *metaPort) SetLinkUp(bool) error      { return nil }
func (p *metaPort) Close() error              { p.once.Do(func() { close(p.closed) }); return nil }

var allCaps = offload.Caps{Csum: true, TSO4: true, TSO6: true, USO: true}

// offloadPair is two Interfaces on one soft fabric, a behind a metaPort,
// b behind hostB (a metaPort unless the test gives a plain port), each
// knowing the other as a neighbour.
type offloadPair struct {
	fab    *soft.Fabric
	a, b   *Interface
	pa     *metaPort
	dstMAC frame.MAC // b as a's host sees it
}

func newOffloadPair(t testing.TB, mode Mode, fcfg soft.Config, hostB HostPort) *offloadPair {
	t.Helper()
	pa := newMetaPort(1, allCaps)
	p := newPortPair(t, mode, fcfg, pa, hostB)
	p.pa = pa
	return p
}

// newPortPair is newOffloadPair with a behind hostA (pa left nil).
func newPortPair(t testing.TB, mode Mode, fcfg soft.Config, hostA, hostB HostPort) *offloadPair {
	t.Helper()
	p := &offloadPair{fab: soft.NewFabric(fcfg)}
	mk := func(name string, port HostPort) *Interface {
		dev, err := p.fab.NewDevice(name)
		if err != nil {
			t.Fatal(err)
		}
		ifc, err := New(Config{Device: dev, Host: port, Mode: mode, CM: fastCM()})
		if err != nil {
			t.Fatal(err)
		}
		if err := ifc.Start(); err != nil {
			t.Fatal(err)
		}
		return ifc
	}
	p.a, p.b = mk("a", hostA), mk("b", hostB)
	t.Cleanup(p.close)
	p.a.neigh.mu.Lock()
	n := p.a.neigh.learn(p.b.HWAddr(), netip.Addr{}, time.Now())
	p.a.neigh.mu.Unlock()
	p.b.neigh.mu.Lock()
	p.b.neigh.learn(p.a.HWAddr(), netip.Addr{}, time.Now())
	p.b.neigh.mu.Unlock()
	p.dstMAC = n.mac
	return p
}

// close closes both Interfaces and the fabric (again at cleanup).
func (p *offloadPair) close() {
	p.a.Close()
	p.b.Close()
	p.fab.Close()
}

// superFrame builds an Ethernet frame holding one TCP (or UDP) packet of
// payload random bytes from a's host to b's, in the state a host leaves a
// super frame: a valid IPv4 header checksum and the L4 checksum field
// holding the pseudo-header sum (NeedsCsum). With mss > 0 the Meta makes
// it a GSO frame.
func (p *offloadPair) superFrame(t testing.TB, r *rand.Rand, v6, tcp bool, payload, mss int) metaFrame {
	t.Helper()
	l4 := 8
	proto := byte(offload.ProtoUDP)
	if tcp {
		l4, proto = 32, offload.ProtoTCP // 12 bytes of options, as Linux's timestamps
	}
	var et uint16 = frame.EtherTypeIPv4
	iph := 20
	if v6 {
		et, iph = frame.EtherTypeIPv6, 40
	}
	b := make([]byte, frame.EthHdrLen+iph+l4+payload)
	frame.PutEthernet(b, frame.EthHeader{Dst: p.dstMAC, Src: frame.MAC(p.pa.mac), EtherType: et})
	ip := b[frame.EthHdrLen:]
	if v6 {
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(l4+payload))
		ip[6], ip[7] = proto, 64
		copy(ip[8:24], netip.MustParseAddr("fd00::1").AsSlice())
		copy(ip[24:40], netip.MustParseAddr("fd00::2").AsSlice())
	} else {
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(iph+l4+payload))
		binary.BigEndian.PutUint16(ip[4:], 0x1234)
		ip[6] = 0x40 // DF
		ip[8], ip[9] = 64, proto
		copy(ip[12:16], []byte{10, 0, 0, 1})
		copy(ip[16:20], []byte{10, 0, 0, 2})
	}
	h := ip[iph:]
	binary.BigEndian.PutUint16(h[0:], 40000)
	binary.BigEndian.PutUint16(h[2:], 5201)
	if tcp {
		binary.BigEndian.PutUint32(h[4:], 1000)
		binary.BigEndian.PutUint32(h[8:], 77)
		h[12] = byte(l4/4) << 4
		h[13] = 0x18 // PSH|ACK
		binary.BigEndian.PutUint16(h[14:], 512)
		h[20], h[21], h[22], h[23] = 1, 1, 8, 10 // NOP NOP timestamps
	} else {
		binary.BigEndian.PutUint16(h[4:], uint16(l4+payload))
	}
	for k := range payload {
		b[frame.EthHdrLen+iph+l4+k] = byte(r.Uint32())
	}
	if _, err := offload.FillChecksums(b, frame.EthHdrLen); err != nil {
		t.Fatal(err)
	}
	hd, err := offload.SetPartial(b, frame.EthHdrLen)
	if err != nil {
		t.Fatal(err)
	}
	m := offload.Meta{NeedsCsum: true, CsumStart: uint16(hd.L4), CsumOffset: uint16(hd.CsumOffset())}
	if mss > 0 {
		m.GSOSize = uint16(mss)
		switch {
		case !tcp:
			m.GSO = offload.GSOUDPL4
		case v6:
			m.GSO = offload.GSOTCPv6
		default:
			m.GSO = offload.GSOTCPv4
		}
	}
	return metaFrame{b: b, m: m}
}

// receive takes n frames from port out (failing after 10 s) and checks
// that none is larger than the datagram-mode MTU allows when ud.
func receive(t *testing.T, out chan metaFrame, n int) []metaFrame {
	t.Helper()
	got := make([]metaFrame, 0, n)
	deadline := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case f := <-out:
			got = append(got, f)
		case <-deadline:
			t.Fatalf("received %d of %d frames", len(got), n)
		}
	}
	select {
	case f := <-out:
		t.Fatalf("frame %d more than expected: %d bytes, %+v", n+1, len(f.b), f.m)
	case <-time.After(50 * time.Millisecond):
		// Nothing else in flight: every send was accounted for above.
	}
	return got
}

// l4Payload is the TCP/UDP payload length of an Ethernet frame (0 if it
// does not parse).
func l4Payload(f []byte) int {
	hd, err := offload.Parse(f, frame.EthHdrLen)
	if err != nil {
		return 0
	}
	return hd.Len - hd.End
}

// receivePayload takes frames from out until their TCP/UDP payloads add
// up to want bytes (failing after 10 s), then checks nothing more comes:
// the number of frames is GRO's business.
func receivePayload(t *testing.T, out chan metaFrame, want int) []metaFrame {
	t.Helper()
	var got []metaFrame
	n := 0
	deadline := time.After(10 * time.Second)
	for n < want {
		select {
		case f := <-out:
			got = append(got, f)
			n += l4Payload(f.b)
		case <-deadline:
			t.Fatalf("received %d of %d payload bytes in %d frames", n, want, len(got))
		}
	}
	select {
	case f := <-out:
		t.Fatalf("a frame more than expected: %d bytes, %+v", len(f.b), f.m)
	case <-time.After(50 * time.Millisecond):
	}
	return got
}

// checkSegments verifies that the frames b's host received are the
// segments of sent: each with a valid checksum once its Meta is honoured
// (a NeedsCsum completed as the host's stack would take it), at most
// maxIP bytes of IP, or, coalesced by GRO, a TCP super frame of at most
// 64 KiB cut at sent's own GSO size, and their L4 payloads concatenated
// equal sent's.
func checkSegments(t *testing.T, sent metaFrame, got []metaFrame, maxIP int, wantMeta func(offload.Meta) bool) {
	t.Helper()
	sh, err := offload.Parse(sent.b, frame.EthHdrLen)
	if err != nil {
		t.Fatal(err)
	}
	var payload []byte
	for k, f := range got {
		if f.m.GSO != offload.GSONone {
			if len(f.b)-frame.EthHdrLen > 65535 || !f.m.NeedsCsum || f.m.GSOSize != sent.m.GSOSize {
				t.Errorf("frame %d: GRO frame of %d bytes with %+v (sent GSO size %d)", k, len(f.b), f.m, sent.m.GSOSize)
			}
		} else {
			if len(f.b)-frame.EthHdrLen > maxIP {
				t.Errorf("frame %d: %d bytes of IP, MTU %d", k, len(f.b)-frame.EthHdrLen, maxIP)
			}
			if !wantMeta(f.m) {
				t.Errorf("frame %d: Meta %+v", k, f.m)
			}
		}
		b := bytes.Clone(f.b)
		hd, err := offload.Parse(b, frame.EthHdrLen)
		if err != nil {
			t.Fatalf("frame %d: %v", k, err)
		}
		if f.m.NeedsCsum {
			if int(f.m.CsumStart) != hd.L4 || int(f.m.CsumOffset) != hd.CsumOffset() {
				t.Fatalf("frame %d: NeedsCsum at %d+%d, TCP/UDP checksum at %d+%d", k, f.m.CsumStart, f.m.CsumOffset, hd.L4, hd.CsumOffset())
			}
			offload.CompletePartial(b[:hd.Len], hd.L4, hd.CsumOffset())
		}
		if !offload.VerifyChecksums(b, frame.EthHdrLen) {
			t.Fatalf("frame %d: checksums invalid (Meta %+v)", k, f.m)
		}
		payload = append(payload, b[hd.End:hd.Len]...)
	}
	if !bytes.Equal(payload, sent.b[sh.End:sh.Len]) {
		t.Fatalf("payload: %d bytes received, %d sent, or contents differ", len(payload), sh.Len-sh.End)
	}
}

// TestOffloadLSO: in datagram mode, a TSO/USO super frame from the host
// becomes one UD LSO work request (one send slot, one tx_packets), which
// the HCA cuts into MTU-sized packets; the peer's host gets every segment
// with its checksum partial at the right offsets (the soft fabric passes
// the state across as veth does) and the payload intact. A receiving host
// that takes TCP super frames gets the TCP segments coalesced (GRO);
// one that takes only partial checksums gets each segment.
func TestOffloadLSO(t *testing.T) {
	for _, c := range []struct {
		name    string
		v6, tcp bool
	}{{"tcp4", false, true}, {"tcp6", true, true}, {"udp4", false, false}, {"udp6", true, false}} {
		for _, host := range []struct {
			accept offload.Caps
			gather bool
		}{{offload.Caps{Csum: true}, false}, {allCaps, false}, {allCaps, true}} {
			accept := host.accept
			t.Run(fmt.Sprintf("%s/host-tso=%t/gather=%t", c.name, accept.TSO4, host.gather), func(t *testing.T) {
				pb := newMetaPort(2, accept)
				var port HostPort = pb
				gp := &gatherPort{metaPort: pb}
				if host.gather {
					port = gp
				}
				p := newOffloadPair(t, ModeDatagram, soft.Config{Seed: 3}, port)
				if got := p.pa.lastSet(); got != allCaps {
					t.Fatalf("datagram mode on an LSO device advertises %+v, want %+v", got, allCaps)
				}
				iph := map[bool]int{false: 20, true: 40}[c.v6]
				l4 := map[bool]int{false: 8, true: 32}[c.tcp]
				mss := p.a.MTU() - iph - l4
				sent := p.superFrame(t, rand.New(rand.NewPCG(1, 2)), c.v6, c.tcp, 60000, mss)
				segs := (60000 + mss - 1) / mss
				before := p.a.Stats().Counters
				p.pa.in <- sent
				var got []metaFrame
				if accept.TSO4 {
					got = receivePayload(t, pb.out, 60000)
				} else {
					got = receive(t, pb.out, segs)
				}
				checkSegments(t, sent, got, p.a.MTU(), func(m offload.Meta) bool { return m.NeedsCsum && m.GSO == offload.GSONone })
				st := p.a.Stats()
				if o := st.Offloads; o.TxLSOWRs != 1 || o.TxLSOPackets != uint64(segs) || o.TxSWSegmented != 0 || o.TxGSOFrames != 1 {
					t.Fatalf("offload counters %+v, want 1 LSO WR of %d packets", o, segs)
				}
				if d := st.Counters.TxPackets - before.TxPackets; d != 1 {
					t.Fatalf("tx_packets grew by %d for one LSO WR, want 1 (one skb)", d)
				}
				if d := st.Counters.TxBytes - before.TxBytes; d != uint64(len(sent.b)-headroom) {
					t.Fatalf("tx_bytes grew by %d, want the super frame's %d", d, len(sent.b)-headroom)
				}
				if n := p.fab.Stats().UDLSOSegments; n != uint64(segs) {
					t.Fatalf("fabric carried %d LSO segments, want %d", n, segs)
				}
				if p.a.tx.outstanding.Load() != 0 {
					t.Fatalf("credits not returned: %d outstanding", p.a.tx.outstanding.Load())
				}
				ob := p.b.Stats()
				if ob.Counters.RxPackets != uint64(segs) {
					t.Fatalf("receiver rx_packets %d, want the %d packets received (before GRO)", ob.Counters.RxPackets, segs)
				}
				switch {
				case accept.TSO4 && c.tcp && (ob.Offloads.RxGROFrames == 0 || len(got) >= segs):
					t.Fatalf("TCP to a host taking super frames: %d frames for %d segments, GRO %+v", len(got), segs, ob.Offloads)
				case (!accept.TSO4 || !c.tcp) && ob.Offloads.RxGROFrames != 0:
					t.Fatalf("GRO ran where it must not: %+v", ob.Offloads)
				case host.gather && c.tcp && gp.pieced.Load() != int64(ob.Offloads.RxGROFrames):
					// A GatherPort gets every super frame in pieces (headers,
					// then the payloads in the receive buffers).
					t.Fatalf("%d frames written in pieces for %d GRO frames", gp.pieced.Load(), ob.Offloads.RxGROFrames)
				}
			})
		}
	}
}

// TestOffloadSoftwareSegmentation: on an HCA without LSO, datagram mode
// advertises checksum offload only; a super frame that arrives all the
// same (a host that ignores the advertisement, or one built before a mode
// switch) is cut in software into the engine's own buffers, one UD send
// per segment, each with complete checksums.
func TestOffloadSoftwareSegmentation(t *testing.T) {
	pb := newMetaPort(2, allCaps)
	p := newOffloadPair(t, ModeDatagram, soft.Config{Seed: 4, NoOffloads: true}, pb)
	if got, want := p.pa.lastSet(), (offload.Caps{Csum: true}); got != want {
		t.Fatalf("datagram mode without LSO advertises %+v, want %+v", got, want)
	}
	mss := p.a.MTU() - 20 - 32
	sent := p.superFrame(t, rand.New(rand.NewPCG(5, 6)), false, true, 50000, mss)
	segs := (50000 + mss - 1) / mss
	before := p.a.Stats().Counters
	p.pa.in <- sent
	got := receivePayload(t, pb.out, 50000)
	checkSegments(t, sent, got, p.a.MTU(), func(m offload.Meta) bool { return m == offload.Meta{} })
	st := p.a.Stats()
	if o := st.Offloads; o.TxSWSegmented != 1 || o.TxSWSegments != uint64(segs) || o.TxLSOWRs != 0 {
		t.Fatalf("offload counters %+v, want one super frame cut into %d", o, segs)
	}
	if d := st.Counters.TxPackets - before.TxPackets; d != uint64(segs) {
		t.Fatalf("tx_packets grew by %d, want %d sends", d, segs)
	}
	if p.fab.Stats().UDLSOSegments != 0 {
		t.Fatal("LSO used on a device without it")
	}
}

// TestOffloadChecksumMapping: a partial checksum from the host is left to
// the HCA (SendIPCsum) where it has checksum offload and completed in
// software where it has not; on receive a partial checksum reaches an
// OffloadPort host as NeedsCsum and a plain host complete, and a checksum
// the HCA verified reaches it as DataValid. Both modes.
func TestOffloadChecksumMapping(t *testing.T) {
	for _, mode := range []Mode{ModeDatagram, ModeConnected} {
		for _, noOff := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/nooffloads=%t", mode, noOff), func(t *testing.T) {
				pb := newMetaPort(2, allCaps)
				p := newOffloadPair(t, mode, soft.Config{Seed: 7, NoOffloads: noOff}, pb)
				r := rand.New(rand.NewPCG(8, 9))
				var o0, ob0 OffloadStats
				if mode == ModeConnected {
					// The first frame parks while the connection comes up,
					// and parked frames are finished in software.
					p.pa.in <- p.superFrame(t, r, false, true, 100, 0)
					receive(t, pb.out, 1)
					o0, ob0 = p.a.Stats().Offloads, p.b.Stats().Offloads
				}
				sent := p.superFrame(t, r, false, true, 1000, 0)
				p.pa.in <- sent
				got := receive(t, pb.out, 1)
				checkSegments(t, sent, got, p.a.MTU(), func(m offload.Meta) bool {
					if noOff {
						return m == offload.Meta{}
					}
					return m.NeedsCsum
				})
				o := p.a.Stats().Offloads
				hw, sw := o.TxCsumHW-o0.TxCsumHW, o.TxCsumSW-o0.TxCsumSW
				if noOff && (sw != 1 || hw != 0) || !noOff && (hw != 1 || sw != 0) {
					t.Fatalf("offload counters %+v (before %+v)", o, o0)
				}
				if mode == ModeConnected && len(p.a.Stats().TXConns) != 1 {
					t.Fatalf("frame did not go over RC: %+v", p.a.Stats().TXConns)
				}
				if !noOff {
					if o := p.b.Stats().Offloads; o.RxCsumPartial-ob0.RxCsumPartial != 1 {
						t.Fatalf("receiver offload counters %+v", o)
					}
				}
			})
		}
	}
}

// TestOffloadPartialToPlainHost: a plain HostPort (no metadata) gets a
// message the HCA left partial with its checksum completed.
func TestOffloadPartialToPlainHost(t *testing.T) {
	var mu sync.Mutex
	var frames [][]byte
	arrived := make(chan struct{}, 16)
	pb := newMemPort(2, func(f [][]byte) {
		mu.Lock()
		for _, b := range f {
			frames = append(frames, bytes.Clone(b))
		}
		mu.Unlock()
		arrived <- struct{}{}
	})
	p := newOffloadPair(t, ModeDatagram, soft.Config{Seed: 10}, pb)
	sent := p.superFrame(t, rand.New(rand.NewPCG(1, 1)), true, false, 3000, 0)
	p.pa.in <- sent
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing arrived")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(frames) != 1 || !offload.VerifyChecksums(frames[0], frame.EthHdrLen) {
		t.Fatalf("%d frames, checksum valid %t", len(frames), len(frames) == 1 && offload.VerifyChecksums(frames[0], frame.EthHdrLen))
	}
	if o := p.b.Stats().Offloads; o.RxCsumDone != 1 || o.HostPort {
		t.Fatalf("receiver offload counters %+v", o)
	}
}

// TestOffloadRxCsumOK: a receive the HCA verified (WCIPCsumOK, as the
// RoCEv2 backend reports) reaches an OffloadPort host as DataValid.
func TestOffloadRxCsumOK(t *testing.T) {
	pb := newMetaPort(2, allCaps)
	p := newOffloadPair(t, ModeDatagram, soft.Config{Seed: 11}, pb)
	sent := p.superFrame(t, rand.New(rand.NewPCG(2, 2)), false, true, 500, 0)
	offload.CompletePartial(sent.b, int(sent.m.CsumStart), int(sent.m.CsumOffset))
	b := p.b.ud.bufs[0]
	n := copy(b[headroom:], sent.b[headroom:])
	frame.PutEncap(b[headroom:], frame.EtherTypeIPv4)
	wcs := []hca.WC{{ID: wrID(wrKindUDRecv, 0), Opcode: hca.WCRecv, ByteLen: n, SrcQPN: p.a.HWAddr().QPN(), SrcGID: p.a.HWAddr().GID(), Context: &udQP{}, Flags: hca.WCIPCsumOK}}
	p.b.rxNAPI.Sync(func() { p.b.rx.handleRX(wcs) })
	got := receive(t, pb.out, 1)
	if !got[0].m.DataValid || got[0].m.NeedsCsum {
		t.Fatalf("Meta %+v, want DataValid", got[0].m)
	}
	if o := p.b.Stats().Offloads; o.RxCsumOK != 1 {
		t.Fatalf("receiver offload counters %+v", o)
	}
}

// TestOffloadModeSwitch: the offloads advertised to the host follow the
// mode: TSO/USO in datagram mode (LSO), checksum only in connected mode.
// A super frame the host built before the switch still goes as one UD
// LSO work request (RC has none); on an HCA without LSO it is cut in
// software and sent over the connection.
func TestOffloadModeSwitch(t *testing.T) {
	for _, noOff := range []bool{false, true} {
		t.Run(fmt.Sprintf("nooffloads=%t", noOff), func(t *testing.T) {
			pb := newMetaPort(2, allCaps)
			p := newOffloadPair(t, ModeDatagram, soft.Config{Seed: 12, NoOffloads: noOff}, pb)
			dgram := allCaps
			if noOff {
				dgram = offload.Caps{Csum: true}
			}
			if got := p.pa.lastSet(); got != dgram {
				t.Fatalf("datagram: %+v, want %+v", got, dgram)
			}
			for _, ifc := range []*Interface{p.a, p.b} {
				if err := ifc.SetMode(ModeConnected); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := p.pa.lastSet(), (offload.Caps{Csum: true}); got != want {
				t.Fatalf("connected: %+v, want %+v", got, want)
			}
			if got := p.a.Stats().Offloads.Advertised; got != (offload.Caps{Csum: true}) {
				t.Fatalf("Stats advertised %+v", got)
			}
			// Connection up first (the first frame parks while it connects).
			p.pa.in <- p.superFrame(t, rand.New(rand.NewPCG(3, 3)), false, true, 100, 0)
			receive(t, pb.out, 1)
			mss := p.b.udMTU - 20 - 32
			sent := p.superFrame(t, rand.New(rand.NewPCG(4, 4)), false, true, 40000, mss)
			p.pa.in <- sent
			got := receivePayload(t, pb.out, 40000)
			o := p.a.Stats().Offloads
			if noOff {
				checkSegments(t, sent, got, frame.CMMTU, func(m offload.Meta) bool { return m == offload.Meta{} })
				if o.TxSWSegmented != 1 || o.TxLSOWRs != 0 {
					t.Fatalf("offload counters %+v, want the super frame cut in software", o)
				}
			} else {
				checkSegments(t, sent, got, p.b.udMTU, func(m offload.Meta) bool { return m.NeedsCsum })
				if o.TxLSOWRs != 1 || o.TxSWSegmented != 0 {
					t.Fatalf("offload counters %+v, want one UD LSO work request", o)
				}
			}
			if err := p.a.SetMode(ModeDatagram); err != nil {
				t.Fatal(err)
			}
			if got := p.pa.lastSet(); got != dgram {
				t.Fatalf("back to datagram: %+v", got)
			}
		})
	}
}

// TestOffloadBadMeta: metadata that lies about its frame is a counted
// drop (tx_bad_offload), and nothing is sent for it.
func TestOffloadBadMeta(t *testing.T) {
	pb := newMetaPort(2, allCaps)
	p := newOffloadPair(t, ModeDatagram, soft.Config{Seed: 13}, pb)
	r := rand.New(rand.NewPCG(5, 5))
	tcp := p.superFrame(t, r, false, true, 20000, 4000)
	udp := p.superFrame(t, r, false, false, 20000, 4000)
	lies := map[string]metaFrame{}
	add := func(name string, f metaFrame, mod func(*offload.Meta)) {
		f.b = bytes.Clone(f.b)
		mod(&f.m)
		lies[name] = f
	}
	add("gso size 0", tcp, func(m *offload.Meta) { m.GSOSize = 0 })
	add("tcp gso on udp", udp, func(m *offload.Meta) { m.GSO = offload.GSOTCPv4 })
	add("tcp6 gso on ipv4", tcp, func(m *offload.Meta) { m.GSO = offload.GSOTCPv6 })
	add("gso without csum", tcp, func(m *offload.Meta) { m.NeedsCsum = false })
	add("csum outside frame", tcp, func(m *offload.Meta) { m.CsumStart = 30000 })
	add("csum before ip", tcp, func(m *offload.Meta) { m.CsumStart = 2 })
	add("gso csum not at l4", tcp, func(m *offload.Meta) { m.CsumOffset = 6 })
	add("unknown gso", tcp, func(m *offload.Meta) { m.GSO = 3 })
	for name, f := range lies {
		before := p.a.Drop("tx_bad_offload")
		p.pa.in <- f
		deadline := time.Now().Add(10 * time.Second)
		for p.a.Drop("tx_bad_offload") == before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not dropped as tx_bad_offload; drops %v", name, p.a.Stats().Drops)
			}
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case f := <-pb.out:
		t.Fatalf("a lying frame got through: %d bytes %+v", len(f.b), f.m)
	case <-time.After(50 * time.Millisecond):
	}
	if o := p.a.Stats().Offloads; o.TxLSOWRs != 0 || o.TxSWSegmented != 0 {
		t.Fatalf("offload work done for lying frames: %+v", o)
	}
}

// offloadBench drives super frames through a into b's counting host.
type offloadBench struct {
	p         *offloadPair
	frame     metaFrame
	payload   int // TCP payload bytes per super frame
	delivered atomic.Int64
	arrived   chan struct{}
	deadline  *time.Timer
}

func newOffloadBench(tb testing.TB, mode Mode, fcfg soft.Config, payload int, gather bool) *offloadBench {
	ob := &offloadBench{arrived: make(chan struct{}, 1), deadline: time.NewTimer(time.Hour)}
	tb.Cleanup(func() { ob.deadline.Stop() })
	pb := newMetaPort(2, allCaps)
	arrived := func(n int) {
		ob.delivered.Add(int64(n))
		select {
		case ob.arrived <- struct{}{}:
		default:
		}
	}
	pb.sink = func(f [][]byte, _ []offload.Meta) {
		n := 0
		for _, b := range f {
			n += l4Payload(b)
		}
		arrived(n)
	}
	var port HostPort = pb
	if gather {
		// GRO's frames in pieces: a super frame is its headers, then
		// payloads.
		port = &gatherPort{metaPort: pb, vecSink: func(f [][][]byte, _ []offload.Meta) {
			n := 0
			for _, pieces := range f {
				if len(pieces) == 1 {
					n += l4Payload(pieces[0])
					continue
				}
				for _, p := range pieces[1:] {
					n += len(p)
				}
			}
			arrived(n)
		}}
	}
	ob.p = newOffloadPair(tb, mode, fcfg, port)
	mss := ob.p.a.MTU() - 20 - 32
	ob.frame = ob.p.superFrame(tb, rand.New(rand.NewPCG(1, 9)), false, true, payload, mss)
	ob.payload = payload
	return ob
}

// send pushes n super frames in windows of w and waits until b's host has
// every payload byte (in segments or, by GRO, super frames).
func (ob *offloadBench) send(tb testing.TB, n, w int) {
	start := ob.delivered.Load()
	for sent := 0; sent < n; {
		k := min(w, n-sent)
		for range k {
			// The engine checksums and segments in its own buffers; the
			// frame it reads is a copy of this one.
			ob.p.pa.in <- ob.frame
		}
		sent += k
		// One timer, reset per window: the harness allocates nothing, so
		// the allocation count is the engine's.
		ob.deadline.Reset(10 * time.Second)
		for ob.delivered.Load()-start < int64(sent*ob.payload) {
			select {
			case <-ob.arrived:
			case <-ob.deadline.C:
				st := ob.p.a.Stats()
				tb.Fatalf("delivered %d of %d bytes; a: %+v %+v %v", ob.delivered.Load()-start, sent*ob.payload, st.Counters, st.Offloads, st.Drops)
			}
		}
	}
}

// BenchmarkEngineOffload: TSO super frames in on a's host port, out of
// b's as MTU-sized frames: by UD LSO on an HCA with it, cut in software
// on one without. Bytes are the super frames' payload.
func BenchmarkEngineOffload(b *testing.B) {
	for _, c := range []struct {
		name   string
		fcfg   soft.Config
		gather bool
	}{{"lso", soft.Config{Seed: 1}, false}, {"lso-gather", soft.Config{Seed: 1}, true}, {"software", soft.Config{Seed: 1, NoOffloads: true}, false}} {
		b.Run(c.name, func(b *testing.B) {
			const payload = 60000
			ob := newOffloadBench(b, ModeDatagram, c.fcfg, payload, c.gather)
			ob.send(b, 64, 8)
			b.SetBytes(payload)
			b.ReportAllocs()
			b.ResetTimer()
			ob.send(b, b.N, 8)
		})
	}
}

// TestEngineOffloadAllocs: the offload paths allocate nothing per frame
// in steady state.
func TestEngineOffloadAllocs(t *testing.T) {
	for _, c := range []struct {
		name   string
		fcfg   soft.Config
		gather bool
	}{{"lso", soft.Config{Seed: 2}, false}, {"lso-gather", soft.Config{Seed: 2}, true}, {"software", soft.Config{Seed: 2, NoOffloads: true}, false}} {
		t.Run(c.name, func(t *testing.T) {
			ob := newOffloadBench(t, ModeDatagram, c.fcfg, 60000, c.gather)
			ob.send(t, 64, 8)
			allocs := testing.AllocsPerRun(10, func() { ob.send(t, 16, 8) })
			if perFrame := allocs / 16; perFrame > 0.1 {
				t.Fatalf("%.2f allocations per super frame in steady state", perFrame)
			}
		})
	}
}
