package netstack

import (
	"net"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
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
