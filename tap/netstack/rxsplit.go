package netstack

import (
	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// splitMinPayload is the smallest payload worth a chunk of its own: below
// it, the copy gVisor makes (see rxBuffer) costs less than a second chunk.
const splitMinPayload = 512

// rxBuffer copies a received frame into a gVisor buffer for the stack.
//
// A frame larger than splitMinPayload past its headers is stored as two
// chunks: the Ethernet, IP and TCP/UDP headers in a small one, the payload
// in another. gVisor's IPv4 receive path holds a reference to the network
// header's chunk while it calls NetworkHeader().Slice() again, and
// Buffer.PullUp clones a shared chunk whole before returning a slice of
// it: with the frame in one chunk that is a 64 KiB allocation, clear and
// copy per packet at MTU 65520, a quarter of the receiver's CPU. With the
// headers apart, the clone is of the header chunk only.
func rxBuffer(frame []byte, proto uint16) buffer.Buffer {
	split := headersLen(frame, proto)
	if split == 0 || len(frame)-split < splitMinPayload {
		return buffer.MakeWithData(frame)
	}
	buf := buffer.MakeWithData(frame[:split])
	buf.Append(buffer.NewViewWithData(frame[split:]))
	return buf
}

// gatheredBuffer makes a gVisor buffer of frame, which is v's bytes, with
// the split rxBuffer makes: the headers copied into a small chunk of their
// own, the payload left where it is, in v (trimmed to it), so the payload
// is not copied again. It takes v over.
func gatheredBuffer(v *buffer.View, frame []byte, proto uint16) buffer.Buffer {
	split := headersLen(frame, proto)
	if split == 0 || len(frame)-split < splitMinPayload {
		return buffer.MakeWithView(v)
	}
	buf := buffer.MakeWithData(frame[:split])
	v.TrimFront(split)
	buf.Append(v)
	return buf
}

// headersLen returns the length of the Ethernet, IP and TCP or UDP headers
// at the front of frame, or 0 when the frame is anything else (a fragment,
// IPv6 extension headers, another protocol) or its headers are not
// well-formed: such frames stay in one chunk, and gVisor judges them.
func headersLen(frame []byte, proto uint16) int {
	h, ok := parseFrameHeaders(frame, proto)
	if !ok {
		return 0
	}
	return h.end
}

// frameHeaders locates the headers of a TCP or UDP frame that is not a
// fragment and has no IPv6 extension headers.
type frameHeaders struct {
	l4        int   // offset of the TCP or UDP header in the frame
	end       int   // offset of the payload: the length of all headers
	transport uint8 // header.TCPProtocolNumber or header.UDPProtocolNumber
}

// parseFrameHeaders parses the Ethernet, IP and TCP or UDP headers at the
// front of frame; ok is false for anything headersLen leaves whole.
func parseFrameHeaders(frame []byte, proto uint16) (h frameHeaders, ok bool) {
	if len(frame) < ethernetHeaderLen {
		return h, false
	}
	ip, err := packet.ParseIP(frame[ethernetHeaderLen:])
	// Any fragment, first included: its transport header is not the
	// stack's business until reassembly.
	if err != nil || ip.Fragment || ip.IPv6 != (proto == uint16(header.IPv6ProtocolNumber)) ||
		(!ip.IPv6 && proto != uint16(header.IPv4ProtocolNumber)) {
		return h, false
	}
	h.l4, h.transport = ethernetHeaderLen+ip.HeaderLen, ip.Protocol
	n, err := packet.TransportLen(h.transport, frame[h.l4:ethernetHeaderLen+ip.Len])
	if err != nil {
		return h, false
	}
	h.end = h.l4 + n
	return h, true
}
