package netstack

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ipoibcm/ipoib/offload"
)

func FuzzParseEthernet(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 13))
	f.Add(frame(net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}, 0x0800, []byte{0x45}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseEthernet(b)
		if len(b) < ethernetHeaderLen {
			if err == nil {
				t.Fatalf("%d-byte frame parsed", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(h.dst[:], b[:6]) || !bytes.Equal(h.src[:], b[6:12]) || uint16(h.proto) != uint16(b[12])<<8|uint16(b[13]) {
			t.Fatalf("header %+v from %x", h, b[:14])
		}
		if h.broadcast() && !h.multicast() {
			t.Fatal("broadcast but not multicast")
		}
	})
}

// FuzzWriteFrames feeds arbitrary bytes, as the engine might, through the
// filter and into gVisor: nothing may panic, and every frame is either
// delivered or counted under a drop reason.
func FuzzWriteFrames(f *testing.F) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	peer := net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
	f.Add(frame(mac, peer, 0x0800, []byte{0x45, 0, 0, 20, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1}))
	f.Add(frame(mac, peer, 0x86dd, make([]byte, 40)))
	f.Add(frame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, peer, 0x0806, make([]byte, 28)))
	f.Add([]byte{1})
	h, err := New(Config{MAC: mac, Addrs: []netip.Prefix{addrA4, addrA6}, QueueLen: 8})
	if err != nil {
		f.Fatal(err)
	}
	defer h.Close()
	f.Fuzz(func(t *testing.T, b []byte) {
		before := h.Counters()
		if _, err := h.WriteFrames([][]byte{b}); err != nil {
			t.Fatal(err)
		}
		after := h.Counters()
		delivered := after.RxPackets - before.RxPackets
		dropped := after.RxDropped() - before.RxDropped()
		if delivered+dropped != 1 {
			t.Fatalf("frame %x: delivered %d dropped %d", b, delivered, dropped)
		}
		drain(t, h) // keep the reply queue from filling
	})
}

// FuzzIsStalePMTU feeds arbitrary frames to the stale PMTU filter.
func FuzzIsStalePMTU(f *testing.F) {
	f.Add(fragNeededFrame([]byte("\x02\x00\x00\x00\x00\x01"), 1500), 1500)
	f.Add(packetTooBigFrame(1280), 1400)
	f.Fuzz(func(t *testing.T, frame []byte, mtu int) {
		isStalePMTU(frame, mtu)
	})
}

// FuzzSegmenter cuts arbitrary frames: it must never panic, and every cut
// must fit the MTU and carry part of the payload.
func FuzzSegmenter(f *testing.F) {
	f.Add(tcpFrame(false, 1, header.TCPFlagAck|header.TCPFlagFin, make([]byte, 5000)), 1448, false)
	f.Add(tcpFrame(true, 1, header.TCPFlagAck, make([]byte, 3000)), 1208, true)
	f.Fuzz(func(t *testing.T, frame []byte, mss int, partial bool) {
		if len(frame) > maxFrameSize || mss > maxFrameSize {
			return
		}
		c := newSegmenter()
		copy(c.frame, frame)
		if !c.load(len(frame), mss, partial) {
			return
		}
		dst := make([]byte, maxFrameSize)
		for cuts := 0; c.pending(); cuts++ {
			n, _ := c.cut(dst)
			if n == 0 || n > len(frame) || cuts > len(frame) {
				t.Fatalf("cut %d: %d bytes of a %d-byte frame at MSS %d", cuts, n, len(frame), mss)
			}
		}
	})
}

// FuzzFragRenumberer rewrites arbitrary frames: it must never panic.
func FuzzFragRenumberer(f *testing.F) {
	f.Add(ipv4Fragment(0, 0, true))
	f.Add(ipv4Fragment(0, 185, false))
	f.Fuzz(func(t *testing.T, frame []byte) {
		var r fragRenumberer
		r.renumber(frame)
		r.renumber(frame)
	})
}

// FuzzWriteFramesMeta feeds arbitrary frames with arbitrary offload
// metadata into the host: nothing may panic, and a frame is delivered
// (once, or as the datagrams of a cut UDP super frame) or counted under a
// drop reason.
func FuzzWriteFramesMeta(f *testing.F) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	tcp := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 3000))
	copy(tcp, mac)
	f.Add(tcp, uint8(offload.GSOTCPv4), uint16(1448), true, uint16(34), uint16(16), false)
	f.Add(tcp, uint8(0), uint16(0), true, uint16(34), uint16(4000), true)
	f.Add(tcp, uint8(offload.GSOUDPL4), uint16(1), true, uint16(34), uint16(6), false)
	h, err := New(Config{MAC: mac, Addrs: []netip.Prefix{addrA4, addrA6}, QueueLen: 8})
	if err != nil {
		f.Fatal(err)
	}
	defer h.Close()
	f.Fuzz(func(t *testing.T, b []byte, gso uint8, size uint16, needs bool, start, off uint16, valid bool) {
		m := offload.Meta{GSO: offload.GSO(gso), GSOSize: size, NeedsCsum: needs, CsumStart: start, CsumOffset: off, DataValid: valid}
		before := h.Counters()
		if _, err := h.WriteFramesMeta([][]byte{b}, []offload.Meta{m}); err != nil {
			t.Fatal(err)
		}
		after := h.Counters()
		delivered := after.RxPackets - before.RxPackets
		dropped := after.RxDropped() - before.RxDropped()
		cut := after.RxResegmented - before.RxResegmented
		if dropped+min(delivered, 1) != 1 || delivered > 1 && cut != 1 {
			t.Fatalf("frame %x meta %+v: delivered %d dropped %d cut %d", b, m, delivered, dropped, cut)
		}
		drain(t, h)
	})
}
