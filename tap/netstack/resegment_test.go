package netstack

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ipoibcm/ipoib/offload"
)

// tcpFrame builds an Ethernet frame carrying one TCP segment with a 12-byte
// timestamp option, valid IP and TCP checksums, and payload.
func tcpFrame(v6 bool, seq uint32, flags header.TCPFlags, payload []byte) []byte {
	ipLen := header.IPv4MinimumSize
	etherType := header.IPv4ProtocolNumber
	if v6 {
		ipLen, etherType = header.IPv6MinimumSize, header.IPv6ProtocolNumber
	}
	const tcpLen = header.TCPMinimumSize + 12
	f := make([]byte, ethernetHeaderLen+ipLen+tcpLen+len(payload))
	header.Ethernet(f).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress("\x02\x00\x00\x00\x00\x01"),
		DstAddr: tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02"),
		Type:    etherType,
	})
	ip := f[ethernetHeaderLen:]
	var src, dst tcpip.Address
	if v6 {
		src, dst = tcpip.AddrFromSlice(net.ParseIP("fd00::1").To16()), tcpip.AddrFromSlice(net.ParseIP("fd00::2").To16())
		header.IPv6(ip).Encode(&header.IPv6Fields{
			PayloadLength:     uint16(len(ip) - header.IPv6MinimumSize),
			TransportProtocol: header.TCPProtocolNumber,
			HopLimit:          64,
			SrcAddr:           src,
			DstAddr:           dst,
		})
	} else {
		src, dst = tcpip.AddrFrom4([4]byte{10, 0, 0, 1}), tcpip.AddrFrom4([4]byte{10, 0, 0, 2})
		h := header.IPv4(ip)
		h.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(ip)),
			ID:          1000,
			Flags:       header.IPv4FlagDontFragment,
			TTL:         64,
			Protocol:    uint8(header.TCPProtocolNumber),
			SrcAddr:     src,
			DstAddr:     dst,
		})
		h.SetChecksum(^h.CalculateChecksum())
	}
	tcp := header.TCP(ip[ipLen:])
	tcp.Encode(&header.TCPFields{
		SrcPort: 40000, DstPort: 5001, SeqNum: seq, AckNum: 77,
		DataOffset: tcpLen, Flags: flags, WindowSize: 1000,
	})
	header.EncodeTSOption(1, 2, tcp[header.TCPMinimumSize:])
	copy(tcp[tcpLen:], payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(tcp)))
	tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	return f
}

// checkCut verifies one cut frame's headers and checksums and returns its
// TCP header and payload.
func checkCut(t *testing.T, f []byte, v6 bool, ipMTU int) (header.TCP, []byte) {
	t.Helper()
	if len(f)-ethernetHeaderLen > ipMTU {
		t.Fatalf("cut of %d bytes exceeds MTU %d", len(f)-ethernetHeaderLen, ipMTU)
	}
	ip := f[ethernetHeaderLen:]
	var tcp header.TCP
	var src, dst tcpip.Address
	if v6 {
		h := header.IPv6(ip)
		if int(h.PayloadLength()) != len(ip)-header.IPv6MinimumSize {
			t.Fatalf("IPv6 payload length %d for %d bytes", h.PayloadLength(), len(ip))
		}
		tcp, src, dst = header.TCP(h.Payload()), h.SourceAddress(), h.DestinationAddress()
	} else {
		h := header.IPv4(ip)
		if int(h.TotalLength()) != len(ip) || !h.IsChecksumValid() {
			t.Fatalf("IPv4 total length %d for %d bytes, checksum valid %v", h.TotalLength(), len(ip), h.IsChecksumValid())
		}
		tcp, src, dst = header.TCP(h.Payload()), h.SourceAddress(), h.DestinationAddress()
	}
	payload := tcp[tcp.DataOffset():]
	if !tcp.IsChecksumValid(src, dst, checksum.Checksum(payload, 0), uint16(len(payload))) {
		t.Fatal("TCP checksum invalid")
	}
	return tcp, payload
}

// mssFor is the payload per cut that fits ipMTU behind frame's headers.
func mssFor(t testing.TB, frame []byte, ipMTU int) int {
	h, err := offload.Parse(frame, ethernetHeaderLen)
	if err != nil {
		t.Fatal(err)
	}
	return ipMTU - (h.End - ethernetHeaderLen)
}

func TestSegmenterCutsToMTU(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		payload := make([]byte, 10000)
		for i := range payload {
			payload[i] = byte(i * 13)
		}
		const seq = 0xfffff000 // the cuts wrap the sequence space
		flags := header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagFin | header.TCPFlagCwr
		frame := tcpFrame(v6, seq, flags, payload)
		const ipMTU = 1500
		c := newSegmenter()
		copy(c.frame, frame)
		if !c.load(len(frame), mssFor(t, frame, ipMTU), false) {
			t.Fatalf("v6=%v: segment not taken", v6)
		}
		var got []byte
		var cuts int
		dst := make([]byte, ipMTU+ethernetHeaderLen)
		for c.pending() {
			n, m := c.cut(dst)
			if n == 0 || m != (offload.Meta{}) {
				t.Fatalf("cut wrote %d bytes, meta %+v", n, m)
			}
			tcp, data := checkCut(t, dst[:n], v6, ipMTU)
			if want := uint32(seq + len(got)); tcp.SequenceNumber() != want {
				t.Fatalf("cut %d: seq %#x, want %#x", cuts, tcp.SequenceNumber(), want)
			}
			last := !c.pending()
			if f := tcp.Flags(); f.Contains(header.TCPFlagFin) != last || f.Contains(header.TCPFlagPsh) != last ||
				f.Contains(header.TCPFlagCwr) != (cuts == 0) || !f.Contains(header.TCPFlagAck) {
				t.Fatalf("cut %d (last %v): flags %v", cuts, last, f)
			}
			if !v6 {
				if id := header.IPv4(dst[ethernetHeaderLen:]).ID(); id != uint16(1000+cuts) {
					t.Fatalf("cut %d: IPv4 ID %d", cuts, id)
				}
			}
			got = append(got, data...)
			cuts++
		}
		maxData := ipMTU - (len(frame) - len(payload) - ethernetHeaderLen)
		if want := (len(payload) + maxData - 1) / maxData; cuts != want {
			t.Fatalf("v6=%v: %d cuts, want %d", v6, cuts, want)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("v6=%v: payload differs after cutting", v6)
		}
	}
}

// TestSegmenterPartial leaves each cut's checksum partial for a reader
// that accepts that: the metadata locates it, and completing it gives the
// checksum a full cut carries.
func TestSegmenterPartial(t *testing.T) {
	frame := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
	c := newSegmenter()
	copy(c.frame, frame)
	if !c.load(len(frame), 1448, true) {
		t.Fatal("segment not taken")
	}
	dst := make([]byte, 1514)
	n, m := c.cut(dst)
	if want := (offload.Meta{NeedsCsum: true, CsumStart: 34, CsumOffset: 16}); m != want {
		t.Fatalf("meta %+v, want %+v", m, want)
	}
	if offload.VerifyChecksums(dst[:n], ethernetHeaderLen) {
		t.Fatal("partial checksum already complete")
	}
	offload.CompletePartial(dst[:n], int(m.CsumStart), int(m.CsumOffset))
	checkCut(t, dst[:n], false, 1500)
}

func TestSegmenterLeavesOthersWhole(t *testing.T) {
	tcp := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
	fragment := append([]byte(nil), tcp...)
	binary.BigEndian.PutUint16(fragment[ethernetHeaderLen+6:], 0x2000) // more fragments
	udp := append([]byte(nil), tcp...)
	udp[ethernetHeaderLen+9] = uint8(header.UDPProtocolNumber)
	badLen := append([]byte(nil), tcp...)
	binary.BigEndian.PutUint16(badLen[ethernetHeaderLen+2:], 100)
	for name, tc := range map[string]struct {
		frame []byte
		mss   int
	}{
		"fits":            {tcp, 9000},
		"fragment":        {fragment, 1448},
		"udp":             {udp, 1448},
		"length mismatch": {badLen, 1448},
		"mss zero":        {tcp, 0},
		"runt":            {tcp[:20], 1448},
	} {
		c := newSegmenter()
		copy(c.frame, tc.frame)
		if c.load(len(tc.frame), tc.mss, false) || c.pending() {
			t.Errorf("%s: taken for cutting", name)
		}
	}
}

// TestSetMTUCutsQueuedSegments lowers both hosts' MTU while A has
// segments built at the old MTU queued: none of them leaves A larger than
// the new MTU, no frame is lost or refused on the way (nothing for TCP
// to recover) and every byte arrives.
//
// Whether A's TCP sees a retransmission timeout is not asserted: with no
// frame lost one can still fire, spuriously, when a loaded machine stalls
// the link goroutines past the RTO (seen 1 run in 10 under load with every
// drop counter 0). The loss counters are what the cutter answers for: A's
// queue (4096 frames) holds more than the whole 8 MiB transfer at the old
// MTU, so a drop or truncation there, or a drop or refused segment at B,
// is a real loss.
func TestSetMTUCutsQueuedSegments(t *testing.T) {
	a := newTestHost(t, Config{MTU: 9000, Addrs: []netip.Prefix{addrA4}})
	b := newTestHost(t, Config{MTU: 9000, Addrs: []netip.Prefix{addrB4}})
	gate := &gatedPort{observedPort: observedPort{Host: a}, open: make(chan struct{}), held: make(chan struct{}, 1)}
	stop := Link(gate, b)
	defer stop()
	const n = 8 << 20
	errc := make(chan error, 1)
	go func() {
		// Once A has queued frames behind the closed gate, both MTUs go
		// down, as in an IPoIB mode switch, then the gate opens.
		<-gate.held
		err := b.SetMTU(1500)
		if err == nil {
			err = a.SetMTU(1500)
		}
		gate.maxFrame.Store(0)
		close(gate.open)
		errc <- err
	}()
	gate.armed.Store(true)
	transfer(t, a, b, netip.AddrPortFrom(addrB4.Addr(), 5003), n)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := gate.maxFrame.Load(); got > 1500+ethernetHeaderLen {
		t.Fatalf("largest frame after the MTU change: %d bytes", got)
	}
	c := a.Counters()
	if c.TxResegmented == 0 {
		t.Fatal("no queued segment was cut; the test proves nothing")
	}
	if lost := c.TxDropped() + c.TxTruncated + b.Counters().RxDropped(); lost != 0 {
		t.Fatalf("%d frames lost: A %+v, B %+v", lost, c, b.Counters())
	}
	// A cut with a bad header or checksum would be dropped by B's stack
	// and recovered by TCP, unseen by the byte check.
	if bs := b.Stack().Stats(); bs.TCP.ChecksumErrors.Value()+bs.TCP.InvalidSegmentsReceived.Value()+bs.IP.MalformedPacketsReceived.Value() != 0 {
		t.Fatalf("B refused segments: %d TCP checksum errors, %d invalid TCP segments, %d malformed IP packets",
			bs.TCP.ChecksumErrors.Value(), bs.TCP.InvalidSegmentsReceived.Value(), bs.IP.MalformedPacketsReceived.Value())
	}
	ts := a.Stack().Stats().TCP
	t.Logf("cut %d queued segments; A: tx dropped %d truncated %d, B: rx dropped %d; A: %d RTOs %d retransmits %d spurious-RTO",
		c.TxResegmented, c.TxDropped(), c.TxTruncated, b.Counters().RxDropped(), ts.Timeouts.Value(), ts.Retransmits.Value(), ts.SpuriousRTORecovery.Value())
}

// gatedPort stops reading from its host, once armed, at the 200th frame
// larger than 1514 bytes (the window is open by then), until open closes;
// held gets a token when that happens.
type gatedPort struct {
	observedPort
	armed atomic.Bool
	big   int
	open  chan struct{}
	held  chan struct{}
	once  sync.Once
}

func (g *gatedPort) ReadFramesContext(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	n, err := g.observedPort.ReadFramesContext(ctx, bufs[:1], sizes[:1])
	if err != nil || !g.armed.Load() || sizes[0] <= 1500+ethernetHeaderLen {
		return n, err
	}
	if g.big++; g.big < 200 {
		return n, err
	}
	g.once.Do(func() {
		g.held <- struct{}{}
		select {
		case <-g.open:
		case <-ctx.Done():
		}
	})
	return n, err
}
