package netstack

import (
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// packetRing is a fixed-capacity FIFO of outbound packets. It holds a
// reference on each packet and serialises it only when ReadFrames copies it
// out, so a queued frame costs a pointer, not an MTU-sized buffer. It is not
// safe for concurrent use; the endpoint guards it.
type packetRing struct {
	slots []*stack.PacketBuffer
	head  int // index of the oldest packet
	count int
}

func newPacketRing(capacity int) packetRing {
	return packetRing{slots: make([]*stack.PacketBuffer, capacity)}
}

func (r *packetRing) len() int   { return r.count }
func (r *packetRing) full() bool { return r.count == len(r.slots) }

// push appends pkt, which the ring now owns a reference to. The caller checks
// full first.
func (r *packetRing) push(pkt *stack.PacketBuffer) {
	r.slots[(r.head+r.count)%len(r.slots)] = pkt
	r.count++
}

// popInto moves up to len(dst) of the oldest packets into dst, transferring
// their references, and returns how many it moved.
func (r *packetRing) popInto(dst []*stack.PacketBuffer) int {
	n := min(len(dst), r.count)
	for i := range n {
		dst[i] = r.slots[r.head]
		r.slots[r.head] = nil
		r.head = (r.head + 1) % len(r.slots)
	}
	r.count -= n
	return n
}

// release drops every queued packet's reference.
func (r *packetRing) release() {
	for r.count > 0 {
		r.slots[r.head].DecRef()
		r.slots[r.head] = nil
		r.head = (r.head + 1) % len(r.slots)
		r.count--
	}
}

// copyPacket serialises pkt (link header included) into dst and returns the
// bytes copied and the packet's full length; they differ when dst is short.
// It walks the packet's views instead of calling AsSlices or ToView, which
// would allocate per packet.
func copyPacket(dst []byte, pkt *stack.PacketBuffer) (copied, full int) {
	views, skip := pkt.AsViewList()
	for v := views.Front(); v != nil && copied < len(dst); v = v.Next() {
		b := v.AsSlice()
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		copied += copy(dst[copied:], b[skip:])
		skip = 0
	}
	return copied, pkt.Size()
}
