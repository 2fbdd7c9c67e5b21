package netstack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ipoibcm/ipoib/offload"
)

// metaPort is one side of LinkOffloads that records the metadata its host
// hands out and may claim to accept less than the host does (accepts), as
// a peer without TSO would.
type metaPort struct {
	*Host
	accepts *offload.Caps

	mu        sync.Mutex
	frames    int
	largest   int
	super     int // frames with GSO metadata
	superB    int // bytes in them
	partial   int // frames with NeedsCsum
	overMTU   int // frames larger than the MTU without GSO metadata
	badSuper  string
	gsoSizeHi int
	// at, once frames reaches atFrames, is closed (once); the test then
	// changes the MTU under the running transfer.
	atFrames int
	at       chan struct{}
	// superAfter and gsoSizeAfter are of the super frames read by calls
	// that began after mark was set.
	mark                     bool
	superAfter, gsoSizeAfter int
}

func (p *metaPort) HostOffloads() offload.Caps {
	if p.accepts != nil {
		return *p.accepts
	}
	return p.Host.HostOffloads()
}

func (p *metaPort) ReadFramesMetaContext(ctx context.Context, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	// The MTU and the mark are taken before the read: the frames it
	// returns were cut for that MTU or a smaller one set meanwhile.
	p.mu.Lock()
	mtu, after := p.Host.MTU(), p.mark
	p.mu.Unlock()
	n, err := p.Host.ReadFramesMetaContext(ctx, bufs, sizes, meta)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range n {
		f, m := bufs[i][:sizes[i]], meta[i]
		p.frames++
		if p.at != nil && p.frames == p.atFrames {
			close(p.at)
		}
		p.largest = max(p.largest, len(f))
		if m.NeedsCsum {
			p.partial++
		}
		if m.GSO == offload.GSONone {
			if len(f)-ethernetHeaderLen > mtu {
				p.overMTU++
			}
			continue
		}
		p.super++
		p.superB += len(f)
		p.gsoSizeHi = max(p.gsoSizeHi, int(m.GSOSize))
		if after {
			p.superAfter++
			p.gsoSizeAfter = max(p.gsoSizeAfter, int(m.GSOSize))
		}
		h, err := offload.Parse(f, ethernetHeaderLen)
		switch {
		case err != nil:
			p.badSuper = err.Error()
		case !m.NeedsCsum || int(m.CsumStart) != h.L4 || m.CsumOffset != 16:
			p.badSuper = "super frame without its partial checksum"
		case h.End-ethernetHeaderLen+int(m.GSOSize) > mtu:
			p.badSuper = "GSO size past the MTU"
		case len(f)-ethernetHeaderLen > 65535:
			p.badSuper = "super frame past 64 KiB"
		}
	}
	return n, err
}

// transferSHA sends n random bytes from src to dst over TCP and fails
// unless the receiver's SHA-256 equals the sender's.
func transferSHA(t *testing.T, src, dst *Host, to netip.AddrPort, n int) {
	t.Helper()
	ctx := testContext(t)
	l, err := dst.ListenTCP(to.Port())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		h := sha256.New()
		got, err := io.Copy(h, c)
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.err = got, err
		done <- r
	}()
	c, err := src.DialTCP(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{1})
	if _, err := io.CopyN(c, io.TeeReader(rng, h), int64(n)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.n != int64(n) || !bytes.Equal(r.sum[:], h.Sum(nil)) {
		t.Fatalf("received %d bytes with SHA-256 %x, sent %d with %x", r.n, r.sum, n, h.Sum(nil))
	}
}

// offloadPair builds A and B from base and joins them with LinkOffloads,
// B claiming to accept bAccepts (nil: what its host accepts).
func offloadPair(t *testing.T, base Config, bAccepts *offload.Caps) (a, b *Host, pa, pb *metaPort) {
	t.Helper()
	ca, cb := base, base
	ca.Addrs = []netip.Prefix{addrA4, addrA6}
	cb.Addrs = []netip.Prefix{addrB4, addrB6}
	a, err := New(ca)
	if err != nil {
		t.Fatal(err)
	}
	b, err = New(cb)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	pa, pb = &metaPort{Host: a}, &metaPort{Host: b, accepts: bAccepts}
	stop, err := LinkOffloads(pa, pb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		a.Close()
		b.Close()
	})
	return a, b, pa, pb
}

// checkStackClean fails if h's stack refused a segment: a bad checksum or
// header on the offload path would be recovered by TCP unseen by the
// byte check.
func checkStackClean(t *testing.T, name string, h *Host) {
	t.Helper()
	s := h.Stack().Stats()
	if s.TCP.ChecksumErrors.Value()+s.TCP.InvalidSegmentsReceived.Value()+s.IP.MalformedPacketsReceived.Value() != 0 {
		t.Fatalf("%s refused segments: %d TCP checksum errors, %d invalid TCP segments, %d malformed IP packets", name,
			s.TCP.ChecksumErrors.Value(), s.TCP.InvalidSegmentsReceived.Value(), s.IP.MalformedPacketsReceived.Value())
	}
}

// TestLinkOffloadsGSO moves TCP between two hosts with host GSO through a
// link that carries the metadata: A's TCP hands out super frames far above
// the MTU, they cross whole, B's stack takes them whole (their partial
// checksums vouched for, as Linux takes CHECKSUM_PARTIAL from a veth) and
// every byte arrives.
func TestLinkOffloadsGSO(t *testing.T) {
	const n = 16 << 20
	for _, tc := range []struct {
		name  string
		mtu   int
		to    netip.Addr
		trust bool
	}{
		{"ipv4-mtu1500", 1500, addrB4.Addr(), false},
		{"ipv6-mtu4092", 4092, addrB6.Addr(), false},
		{"ipv4-mtu4092-trusted", 4092, addrB4.Addr(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, pa, _ := offloadPair(t, Config{MTU: tc.mtu, GSO: true, TrustRXChecksums: tc.trust}, nil)
			transferSHA(t, a, b, netip.AddrPortFrom(tc.to, 5001), n)
			pa.mu.Lock()
			defer pa.mu.Unlock()
			ca, cb := a.Counters(), b.Counters()
			t.Logf("A handed out %d frames, %d super (%d bytes, largest %d, GSO size up to %d), %d partial; B took %d super frames",
				pa.frames, pa.super, pa.superB, pa.largest, pa.gsoSizeHi, pa.partial, cb.RxSuperFrames)
			if pa.badSuper != "" {
				t.Fatal(pa.badSuper)
			}
			// Most of the stream crosses in super frames, each worth
			// several MTU-sized segments.
			if pa.superB < n/2 || pa.largest < 8*tc.mtu || pa.super == 0 {
				t.Fatalf("%d super frames carried %d of %d bytes, largest frame %d: GSO not in use", pa.super, pa.superB, n, pa.largest)
			}
			if pa.overMTU != 0 || ca.TxResegmented != 0 {
				t.Fatalf("%d frames past the MTU without GSO metadata, %d cut by the link", pa.overMTU, ca.TxResegmented)
			}
			if uint64(pa.super) != ca.TxSuperFrames || ca.TxSuperFrames != cb.RxSuperFrames {
				t.Fatalf("super frames: seen %d, A counted %d, B counted %d", pa.super, ca.TxSuperFrames, cb.RxSuperFrames)
			}
			if cb.RxDropped() != 0 {
				t.Fatalf("B dropped %d frames: %+v", cb.RxDropped(), cb)
			}
			// Every partial checksum is vouched for unless B trusts all.
			if want := uint64(pa.partial); tc.trust && cb.RxCsumVouched != 0 || !tc.trust && cb.RxCsumVouched != want {
				t.Fatalf("B vouched for %d checksums, %d frames were partial (trust all: %t)", cb.RxCsumVouched, want, tc.trust)
			}
			checkStackClean(t, "B", b)
		})
	}
}

// TestLinkOffloadsPeerWithoutTSO: a peer that does not accept super frames
// (or partial checksums) never gets them; A's link cuts its host's super
// frames to the MTU (and completes the checksums) instead.
func TestLinkOffloadsPeerWithoutTSO(t *testing.T) {
	const mtu, n = 1500, 8 << 20
	for _, tc := range []struct {
		name    string
		accepts offload.Caps
	}{
		{"csum-only", offload.Caps{Csum: true}},
		{"none", offload.Caps{}},
		{"tso-without-csum", offload.Caps{TSO4: true, TSO6: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, pa, _ := offloadPair(t, Config{MTU: mtu, GSO: true}, &tc.accepts)
			transferSHA(t, a, b, netip.AddrPortFrom(addrB4.Addr(), 5001), n)
			pa.mu.Lock()
			defer pa.mu.Unlock()
			ca := a.Counters()
			if pa.super != 0 || ca.TxSuperFrames != 0 || pa.largest > mtu+ethernetHeaderLen || pa.overMTU != 0 {
				t.Fatalf("%d super frames, largest %d for a peer without TSO", pa.super, pa.largest)
			}
			// Host GSO still ran: its super frames were cut here.
			if ca.TxResegmented == 0 {
				t.Fatal("no super frame was cut by the link; GSO was not on and the test proves nothing")
			}
			if wantPartial := tc.accepts.Csum; (pa.partial > 0) != wantPartial {
				t.Fatalf("%d frames with partial checksums, peer accepts csum=%v", pa.partial, tc.accepts.Csum)
			}
			checkStackClean(t, "B", b)
		})
	}
}

// TestPlainReadFramesWithGSO: host GSO behind a plain ReadFrames reader
// (an engine without OffloadPort, Link) gives only complete MTU-sized
// frames.
func TestPlainReadFramesWithGSO(t *testing.T) {
	p := newPair(t, Config{MTU: 4092, GSO: true})
	transferSHA(t, p.a, p.b, netip.AddrPortFrom(addrB6.Addr(), 5001), 8<<20)
	if got := p.pa.maxFrame.Load(); got > 4092+ethernetHeaderLen {
		t.Fatalf("largest frame %d past MTU 4092", got)
	}
	if c := p.a.Counters(); c.TxResegmented == 0 || c.TxSuperFrames != 0 {
		t.Fatalf("A cut %d super frames, handed out %d whole", c.TxResegmented, c.TxSuperFrames)
	}
	checkStackClean(t, "B", p.b)
}

func TestSetOffloads(t *testing.T) {
	h := newTestHost(t, Config{})
	for _, tc := range []struct{ want, got offload.Caps }{
		{offload.Caps{Csum: true, TSO4: true, TSO6: true, USO: true}, offload.Caps{Csum: true, TSO4: true, TSO6: true}},
		{offload.Caps{TSO4: true, TSO6: true}, offload.Caps{}},
		{offload.Caps{Csum: true, TSO6: true}, offload.Caps{Csum: true, TSO6: true}},
		{offload.Caps{}, offload.Caps{}},
	} {
		got, err := h.SetOffloads(tc.want)
		if err != nil || got != tc.got || h.ep.acceptCaps() != tc.got {
			t.Errorf("SetOffloads(%+v) = %+v, %v; want %+v", tc.want, got, err, tc.got)
		}
	}
	if got := h.HostOffloads(); got != (offload.Caps{Csum: true, TSO4: true, TSO6: true}) {
		t.Errorf("HostOffloads = %+v", got)
	}
}

// udpFrame builds an IPv4 UDP frame from src to dst with a complete
// checksum.
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	f := make([]byte, ethernetHeaderLen+header.IPv4MinimumSize+header.UDPMinimumSize+len(payload))
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(srcMAC), DstAddr: tcpip.LinkAddress(dstMAC), Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(f[ethernetHeaderLen:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(ip)), TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(src.Addr().As4()), DstAddr: tcpip.AddrFrom4(dst.Addr().As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	u := header.UDP(ip[header.IPv4MinimumSize:])
	u.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(u))})
	copy(u[header.UDPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(u)))
	u.SetChecksum(^checksum.Checksum(u, xsum))
	return f
}

// TestWriteFramesMetaUSO: a UDP super frame (USO) is not what the host
// accepts; the link cuts it and the socket reads one datagram per segment.
func TestWriteFramesMetaUSO(t *testing.T) {
	peerMAC := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrB4}})
	to := netip.AddrPortFrom(addrB4.Addr(), 6000)
	c, err := h.ListenUDP(to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 6000)
	for i := range payload {
		payload[i] = byte(i)
	}
	f := udpFrame(h.HostMAC(), peerMAC, netip.AddrPortFrom(addrA4.Addr(), 7000), to, payload)
	h4 := ethernetHeaderLen + header.IPv4MinimumSize
	// USO frames carry a partial checksum.
	binary.BigEndian.PutUint16(f[h4+6:], 0)
	m := offload.Meta{GSO: offload.GSOUDPL4, GSOSize: 1472, NeedsCsum: true, CsumStart: uint16(h4), CsumOffset: 6}
	if _, err := h.WriteFramesMeta([][]byte{f}, []offload.Meta{m}); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 65536)
	for len(got) < len(payload) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if want := min(1472, len(payload)-len(got)); n != want {
			t.Fatalf("datagram of %d bytes, want %d", n, want)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("datagrams differ from the payload")
	}
	if cs := h.Counters(); cs.RxResegmented != 1 || cs.RxPackets != 5 {
		t.Fatalf("counters %+v: want 1 super frame cut into 5 datagrams", cs)
	}
}

// TestWriteFramesMetaRejectsLies: metadata that contradicts its frame is a
// counted drop, never a crash or a packet for the stack.
func TestWriteFramesMetaRejectsLies(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrB4}})
	tcp := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
	copy(tcp, h.HostMAC())
	udp := udpFrame(h.HostMAC(), net.HardwareAddr{2, 0, 0, 0, 0, 9}, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:2"), make([]byte, 3000))
	partial := offload.Meta{NeedsCsum: true, CsumStart: 34, CsumOffset: 16}
	withGSO := func(m offload.Meta, g offload.GSO, size uint16) offload.Meta { m.GSO, m.GSOSize = g, size; return m }
	for name, tc := range map[string]struct {
		frame []byte
		meta  offload.Meta
	}{
		"csum offset past the frame": {tcp, offload.Meta{NeedsCsum: true, CsumStart: 34, CsumOffset: 4000}},
		"csum start in the link hdr": {tcp, offload.Meta{NeedsCsum: true, CsumStart: 4, CsumOffset: 16}},
		"gso size zero":              {tcp, withGSO(partial, offload.GSOTCPv4, 0)},
		"gso without partial csum":   {tcp, offload.Meta{GSO: offload.GSOTCPv4, GSOSize: 1448}},
		"tcp gso on udp":             {udp, withGSO(offload.Meta{NeedsCsum: true, CsumStart: 34, CsumOffset: 6}, offload.GSOTCPv4, 1448)},
		"tcpv6 gso on ipv4":          {tcp, withGSO(partial, offload.GSOTCPv6, 1448)},
		"udp gso on tcp":             {tcp, withGSO(partial, offload.GSOUDPL4, 1448)},
		"unknown gso type":           {tcp, withGSO(partial, 3, 1448)},
		"udp gso past 128 segments":  {udp, withGSO(offload.Meta{NeedsCsum: true, CsumStart: 34, CsumOffset: 6}, offload.GSOUDPL4, 8)},
	} {
		before := h.Counters()
		if _, err := h.WriteFramesMeta([][]byte{tc.frame}, []offload.Meta{tc.meta}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		after := h.Counters()
		if after.RxDroppedOffload != before.RxDroppedOffload+1 || after.RxPackets != before.RxPackets {
			t.Errorf("%s: dropped %d, delivered %d; want one offload drop", name,
				after.RxDroppedOffload-before.RxDroppedOffload, after.RxPackets-before.RxPackets)
		}
	}
}

// TestLinkOffloadsMTUDecrease lowers both MTUs under a running transfer
// whose super frames cross whole (an IPoIB mode switch behind an engine
// that takes TSO): from then on every super frame's GSO size fits the new
// MTU, though gVisor keeps the connection's old MSS, and every byte
// arrives.
func TestLinkOffloadsMTUDecrease(t *testing.T) {
	a, b, pa, _ := offloadPair(t, Config{MTU: 9000, GSO: true}, nil)
	// The link's shuttles already read these (under mu).
	pa.mu.Lock()
	pa.atFrames, pa.at = 100, make(chan struct{})
	pa.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		<-pa.at
		err := b.SetMTU(1500)
		if err == nil {
			err = a.SetMTU(1500)
		}
		pa.mu.Lock()
		pa.mark = true
		pa.mu.Unlock()
		errc <- err
	}()
	transferSHA(t, a, b, netip.AddrPortFrom(addrB4.Addr(), 5001), 32<<20)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	pa.mu.Lock()
	defer pa.mu.Unlock()
	t.Logf("%d super frames after the change, GSO size up to %d (before: up to %d)", pa.superAfter, pa.gsoSizeAfter, pa.gsoSizeHi)
	if pa.badSuper != "" {
		t.Fatal(pa.badSuper)
	}
	if pa.superAfter == 0 || pa.gsoSizeAfter > 1500-40 || pa.gsoSizeHi <= 1500 {
		t.Fatalf("GSO size up to %d before the MTU change, %d super frames after with GSO size up to %d: want segments past 1500 before, within it after",
			pa.gsoSizeHi, pa.superAfter, pa.gsoSizeAfter)
	}
	if c := a.Counters(); c.TxDropped()+c.TxTruncated != 0 {
		t.Fatalf("A lost frames: %+v", c)
	}
	checkStackClean(t, "B", b)
}

// withHopByHop returns an IPv6 TCP frame of tcpFrame's with an empty
// Hop-by-Hop Options header (PadN) in front of the TCP header: a packet
// the link does not parse, so it never vouches for its checksum.
func withHopByHop(f []byte) []byte {
	const hbhLen = 8
	l4 := ethernetHeaderLen + header.IPv6MinimumSize
	out := make([]byte, 0, len(f)+hbhLen)
	out = append(out, f[:l4]...)
	out = append(out, byte(header.TCPProtocolNumber), 0, 1, 4, 0, 0, 0, 0)
	out = append(out, f[l4:]...)
	ip := header.IPv6(out[ethernetHeaderLen:])
	ip.SetNextHeader(uint8(header.IPv6HopByHopOptionsExtHdrIdentifier))
	ip.SetPayloadLength(ip.PayloadLength() + hbhLen)
	return out
}

// partialHopByHop is an IPv6 TCP frame behind a Hop-by-Hop header with a
// partial checksum.
func partialHopByHop(payload int) ([]byte, offload.Meta) {
	f := withHopByHop(tcpFrame(true, 1, header.TCPFlagAck, make([]byte, payload)))
	l4 := ethernetHeaderLen + header.IPv6MinimumSize + 8
	ip := header.IPv6(f[ethernetHeaderLen:])
	seed := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(f)-l4))
	binary.BigEndian.PutUint16(f[l4+header.TCPChecksumOffset:], seed)
	return f, offload.Meta{NeedsCsum: true, CsumStart: uint16(l4), CsumOffset: header.TCPChecksumOffset}
}

// TestWriteFramesMetaVouched checks which received checksums the stack is
// told to take as good (a partial checksum at the TCP field of a whole
// packet, DataValid) and that everything else is still verified: the
// claim holds for the one frame it was made for, an IPv4 header checksum
// is checked before it is made, and a partial checksum the link does not
// vouch for is completed in a copy, the caller's frame untouched.
func TestWriteFramesMetaVouched(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrB4, addrB6}})
	// tcpFrame's segments go to port 5001; with a listener there the
	// stack answers every segment it takes with a RST or SYN-ACK, and
	// counts it valid or not.
	l, err := h.ListenTCP(5001)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	partial := func(f []byte) offload.Meta {
		hd, err := offload.SetPartial(f, ethernetHeaderLen)
		if err != nil {
			t.Fatal(err)
		}
		return offload.Meta{NeedsCsum: true, CsumStart: uint16(hd.L4), CsumOffset: 16}
	}
	corruptTCPCsum := func(f []byte, l4 int) { f[l4+16] ^= 0x5a }
	l4v4 := ethernetHeaderLen + header.IPv4MinimumSize
	l4v6 := ethernetHeaderLen + header.IPv6MinimumSize
	for _, c := range []struct {
		name    string
		frame   func() ([]byte, offload.Meta)
		vouched bool // RxCsumVouched goes up by one
		valid   bool // the stack took the segment (else: a checksum error or a malformed packet)
	}{
		{"partial v4", func() ([]byte, offload.Meta) {
			f := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
			return f, partial(f)
		}, true, true},
		{"partial v6", func() ([]byte, offload.Meta) {
			f := tcpFrame(true, 1, header.TCPFlagAck, make([]byte, 3000))
			return f, partial(f)
		}, true, true},
		// Partial means "not computed": the field's content is not
		// looked at, as Linux does not look at CHECKSUM_PARTIAL's.
		{"partial v4, field not the seed", func() ([]byte, offload.Meta) {
			f := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 100))
			m := partial(f)
			corruptTCPCsum(f, l4v4)
			return f, m
		}, true, true},
		{"data valid v6, wrong checksum", func() ([]byte, offload.Meta) {
			f := tcpFrame(true, 1, header.TCPFlagAck, make([]byte, 100))
			corruptTCPCsum(f, l4v6)
			return f, offload.Meta{DataValid: true}
		}, true, true},
		{"no meta, wrong checksum", func() ([]byte, offload.Meta) {
			f := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 100))
			corruptTCPCsum(f, l4v4)
			return f, offload.Meta{}
		}, false, false},
		{"partial v4, bad IP header checksum", func() ([]byte, offload.Meta) {
			f := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 100))
			m := partial(f)
			f[ethernetHeaderLen+10] ^= 0x5a
			return f, m
		}, false, false},
		{"partial v4, offset not the TCP field", func() ([]byte, offload.Meta) {
			f := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 100))
			m := partial(f)
			m.CsumOffset = 18 // the urgent pointer: completed there, the TCP field stays a seed
			return f, m
		}, false, false},
		{"partial v6 behind hop-by-hop, large", func() ([]byte, offload.Meta) { return partialHopByHop(3000) }, false, true},
		{"partial v6 behind hop-by-hop, small", func() ([]byte, offload.Meta) { return partialHopByHop(100) }, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, m := c.frame()
			copy(f, h.HostMAC())
			before := bytes.Clone(f)
			st := h.Stack().Stats()
			valid, bad := st.TCP.ValidSegmentsReceived.Value(), st.TCP.ChecksumErrors.Value()+st.IP.MalformedPacketsReceived.Value()
			vouched := h.Counters().RxCsumVouched
			if _, err := h.WriteFramesMeta([][]byte{f}, []offload.Meta{m}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(f, before) {
				t.Fatal("the caller's frame was changed")
			}
			gotValid := st.TCP.ValidSegmentsReceived.Value() - valid
			gotBad := st.TCP.ChecksumErrors.Value() + st.IP.MalformedPacketsReceived.Value() - bad
			if want := map[bool]uint64{true: 1}[c.valid]; gotValid != want || gotBad != 1-want {
				t.Fatalf("%d valid segments, %d refused (checksum errors, malformed), want valid=%t", gotValid, gotBad, c.valid)
			}
			if got, want := h.Counters().RxCsumVouched-vouched, map[bool]uint64{true: 1}[c.vouched]; got != want {
				t.Fatalf("RxCsumVouched went up by %d, want %d", got, want)
			}
			if h.ep.rxVouched.Load() {
				t.Fatal("the stack is still told checksums are verified after the delivery")
			}
		})
	}
}

// TestVouchedConcurrentWriters: the claim that a frame's checksum is good
// reaches the stack for that frame alone, however many goroutines write at
// once. Writers of frames whose wrong TCP checksum is vouched for
// (DataValid) race writers of frames with the same wrong checksum and no
// metadata: every vouched one is taken, every other one is refused as a
// checksum error. The claim is endpoint state the stack reads per packet
// (endpoint.rxVouched); were a frame delivered outside writeMu while it is
// set, some unvouched frames would be taken.
func TestVouchedConcurrentWriters(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrB4, addrB6}})
	l, err := h.ListenTCP(5001)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const writers, frames = 4, 300
	l4 := ethernetHeaderLen + header.IPv4MinimumSize
	frame := func(seq uint32) []byte {
		f := tcpFrame(false, seq, header.TCPFlagAck, make([]byte, 64))
		copy(f, h.HostMAC())
		f[l4+16] ^= 0x5a // a wrong TCP checksum
		return f
	}
	st := h.Stack().Stats()
	valid0, bad0 := st.TCP.ValidSegmentsReceived.Value(), st.TCP.ChecksumErrors.Value()
	vouched0 := h.Counters().RxCsumVouched
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for k := range frames {
				var meta []offload.Meta
				if w%2 == 0 {
					meta = []offload.Meta{{DataValid: true}}
				}
				if _, err := h.WriteFramesMeta([][]byte{frame(uint32(w*frames + k + 1))}, meta); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	const each = writers / 2 * frames
	valid, bad := st.TCP.ValidSegmentsReceived.Value()-valid0, st.TCP.ChecksumErrors.Value()-bad0
	if vouched := h.Counters().RxCsumVouched - vouched0; valid != each || bad != each || vouched != each {
		t.Fatalf("%d segments taken, %d checksum errors, %d vouched; want %d of each", valid, bad, vouched, each)
	}
}
