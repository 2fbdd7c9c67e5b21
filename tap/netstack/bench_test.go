package netstack

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ipoibcm/ipoib/offload"
)

// BenchmarkQueueRoundTrip measures the outbound path alone: WritePackets
// queues a batch of 64 1514-byte packets and ReadFrames copies them out.
func BenchmarkQueueRoundTrip(b *testing.B) {
	const batch = 64
	h, err := New(Config{QueueLen: batch, BatchSize: batch})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	drain(b, h)
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: ethernetHeaderLen,
		Payload:            buffer.MakeWithData(make([]byte, 1500)),
	})
	defer pkt.DecRef()
	pkt.LinkHeader().Push(ethernetHeaderLen)
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, 1514)
	}
	sizes := make([]int, batch)
	b.SetBytes(batch * 1514)
	b.ReportAllocs()
	// One list reused across iterations, as a qdisc would: Reset drops the
	// caller's references and keeps the backing array.
	var l stack.PacketBufferList
	for b.Loop() {
		for range batch {
			l.PushBack(pkt.IncRef())
		}
		if n, err := h.ep.WritePackets(l); err != nil || n != batch {
			b.Fatalf("WritePackets = %d, %v", n, err)
		}
		l.Reset()
		if n, err := h.ReadFrames(bufs, sizes); err != nil || n != batch {
			b.Fatalf("ReadFrames = %d, %v", n, err)
		}
	}
}

// BenchmarkWriteFramesFiltered measures the receive filter on frames for
// another host: the drop path must not allocate.
func BenchmarkWriteFramesFiltered(b *testing.B) {
	h, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	f := frame(net.HardwareAddr{2, 9, 9, 9, 9, 9}, net.HardwareAddr{2, 1, 1, 1, 1, 1}, 0x0800, make([]byte, 1500))
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = f
	}
	b.SetBytes(int64(len(frames) * len(f)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.WriteFrames(frames); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteFramesUDP measures the receive path into gVisor for one
// large UDP datagram per frame at three MTUs: the copy into a gVisor
// buffer, IPv4 and UDP processing, and queueing on a bound socket that is
// never read (once its buffer is full gVisor drops, after the IP layer).
// It is where rxBuffer's header split shows: without it the IPv4 layer
// clones every frame's whole chunk.
func BenchmarkWriteFramesUDP(b *testing.B) {
	for _, mtu := range []int{1500, 4092, 65520} {
		b.Run(fmt.Sprintf("mtu%d", mtu), func(b *testing.B) {
			mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
			h, err := New(Config{MAC: mac, Addrs: []netip.Prefix{addrA4}, MTU: mtu, TrustRXChecksums: true})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			c, err := h.ListenUDP(netip.AddrPortFrom(addrA4.Addr(), 9))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ip := make([]byte, mtu)
			header.IPv4(ip).Encode(&header.IPv4Fields{
				TotalLength: uint16(mtu), TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
				SrcAddr: tcpip.AddrFrom4(addrB4.Addr().As4()), DstAddr: tcpip.AddrFrom4(addrA4.Addr().As4()),
			})
			header.UDP(ip[header.IPv4MinimumSize:]).Encode(&header.UDPFields{SrcPort: 7, DstPort: 9, Length: uint16(mtu - header.IPv4MinimumSize)})
			f := frame(mac, net.HardwareAddr{0x02, 0, 0, 0, 0, 2}, 0x0800, ip)
			frames := [][]byte{f}
			b.SetBytes(int64(len(f)))
			b.ReportAllocs()
			before := h.Counters().RxPackets
			for b.Loop() {
				if _, err := h.WriteFrames(frames); err != nil {
					b.Fatal(err)
				}
			}
			if got := h.Counters().RxPackets - before; got != uint64(b.N) {
				b.Fatalf("delivered %d of %d frames", got, b.N)
			}
		})
	}
}

// BenchmarkWriteFramesGathered measures the receive path for a 60000-byte
// UDP datagram with a partial checksum (vouched for: no checksum pass),
// given whole (WriteFramesMeta) and as a GRO writer that gathers gives a
// super frame: its headers, then the payload in 4052-byte pieces
// (WriteFramesGather). Either way each byte is copied once into gVisor;
// the gathered form saves the writer its own copy into a contiguous
// frame.
func BenchmarkWriteFramesGathered(b *testing.B) {
	const size = 60000
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	ip := make([]byte, size)
	header.IPv4(ip).Encode(&header.IPv4Fields{
		TotalLength: size, TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(addrB4.Addr().As4()), DstAddr: tcpip.AddrFrom4(addrA4.Addr().As4()),
	})
	header.IPv4(ip).SetChecksum(^header.IPv4(ip).CalculateChecksum())
	header.UDP(ip[header.IPv4MinimumSize:]).Encode(&header.UDPFields{SrcPort: 7, DstPort: 9, Length: size - header.IPv4MinimumSize})
	f := frame(mac, net.HardwareAddr{0x02, 0, 0, 0, 0, 2}, 0x0800, ip)
	hd, err := offload.SetPartial(f, ethernetHeaderLen)
	if err != nil {
		b.Fatal(err)
	}
	meta := []offload.Meta{{NeedsCsum: true, CsumStart: uint16(hd.L4), CsumOffset: 6}}
	pieces := [][]byte{f[:hd.End]}
	for rest := f[hd.End:]; len(rest) > 0; {
		n := min(len(rest), 4052)
		pieces = append(pieces, rest[:n])
		rest = rest[n:]
	}
	for _, gather := range []bool{false, true} {
		b.Run(map[bool]string{false: "whole", true: "gathered"}[gather], func(b *testing.B) {
			h, err := New(Config{MAC: mac, Addrs: []netip.Prefix{addrA4}, MTU: 65520})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			c, err := h.ListenUDP(netip.AddrPortFrom(addrA4.Addr(), 9))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			frames, gathered := [][]byte{f}, [][][]byte{pieces}
			b.SetBytes(int64(len(f)))
			b.ReportAllocs()
			before := h.Counters()
			for b.Loop() {
				if gather {
					_, err = h.WriteFramesGather(gathered, meta)
				} else {
					_, err = h.WriteFramesMeta(frames, meta)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			after := h.Counters()
			if got := after.RxCsumVouched - before.RxCsumVouched; got != uint64(b.N) || after.RxPackets-before.RxPackets != uint64(b.N) {
				b.Fatalf("delivered %d of %d frames, %d vouched", after.RxPackets-before.RxPackets, b.N, got)
			}
		})
	}
}
