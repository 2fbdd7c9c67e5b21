package netstack

import (
	"context"
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ipoibcm/ipoib/offload"
)

// hostAccepts is what the stack takes from WriteFramesMeta as it is:
// partial checksums and TCP super frames of either family, which gVisor's
// TCP receives whole (it does not hold a segment to its own MSS). A UDP
// super frame would reach a socket as one datagram, so the link cuts it.
var hostAccepts = offload.Caps{Csum: true, TSO4: true, TSO6: true}

// udpMaxSegments bounds the datagrams one UDP super frame may become, as
// Linux's UDP_MAX_SEGMENTS does, so a tiny GSO size cannot turn one frame
// into tens of thousands of packets for the stack.
const udpMaxSegments = 128

// ReadFramesMeta implements ipoibcm.OffloadPort: ReadFrames that also
// fills meta[i]. What the frames may carry is what SetOffloads put in
// effect: with TSO, a TCP segment gVisor built by host GSO (Config.GSO)
// comes out whole, up to 64 KiB, with its GSO size; with Csum, its
// checksum stays partial (NeedsCsum). Anything the reader does not take is
// completed or cut here first. Buffers should hold maxFrameSize bytes; a
// super frame longer than its buffer is truncated and counted.
func (h *Host) ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	return h.ep.readFrames(nil, bufs, sizes, meta, h.ep.acceptCaps())
}

// ReadFramesMetaContext is ReadFramesMeta that also gives up when ctx is
// done, returning an error wrapping ctx.Err().
func (h *Host) ReadFramesMetaContext(ctx context.Context, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	return h.ep.readFrames(ctx, bufs, sizes, meta, h.ep.acceptCaps())
}

// WriteFramesMeta implements ipoibcm.OffloadPort: WriteFrames with each
// frame's metadata. A TCP super frame is delivered to the stack whole (the
// GRO that already happened stays done); a partial checksum is trusted as
// veth trusts CHECKSUM_PARTIAL when the host trusts received checksums
// (Config.TrustRXChecksums), and completed here otherwise, since gVisor
// then verifies every packet. A UDP super frame is cut into its datagrams.
// Metadata that contradicts its frame (a checksum offset outside it, GSO
// on a packet of another kind, GSO without a partial checksum, GSO size
// 0, a UDP super frame of more than 128 datagrams) drops the frame,
// counted as RxDroppedOffload.
//
// DataValid cannot skip gVisor's verification per frame: the stack takes
// that verdict from the link's capabilities for every packet alike
// (CapabilityRXChecksumOffload), so it is honoured exactly when the host
// trusts all received checksums.
func (h *Host) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	return h.ep.writeFrames(frames, meta[:min(len(meta), len(frames))])
}

// HostOffloads implements ipoibcm.OffloadPort: partial checksums and TCP
// super frames (TSO4, TSO6); not USO.
func (h *Host) HostOffloads() offload.Caps { return hostAccepts }

// SetOffloads implements ipoibcm.OffloadPort: what ReadFramesMeta's frames
// may carry from now on. TSO needs Csum (a super frame always carries a
// partial checksum, as Linux's netdev_fix_features insists), and USO is
// never in effect: gVisor builds no UDP super frames. Plain ReadFrames is
// unaffected; its frames are always complete and MTU-sized.
//
// Whether gVisor builds super frames at all is Config.GSO, fixed when each
// TCP connection starts; SetOffloads only decides whether they are cut
// before the reader sees them, so it takes effect at once for every
// connection.
func (h *Host) SetOffloads(want offload.Caps) (offload.Caps, error) {
	got := offload.Caps{Csum: want.Csum, TSO4: want.Csum && want.TSO4, TSO6: want.Csum && want.TSO6}
	h.ep.accept.Store(&got)
	return got, nil
}

// acceptCaps is what SetOffloads put in effect; none before it is called,
// as a TAP has no offloads before TUNSETOFFLOAD.
func (e *endpoint) acceptCaps() offload.Caps {
	if c := e.accept.Load(); c != nil {
		return *c
	}
	return offload.Caps{}
}

// deliverOffloaded delivers a frame whose metadata is not zero: checked
// against the frame, completed or cut where the stack needs it. The caller
// holds writeMu.
func (e *endpoint) deliverOffloaded(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, frame []byte, m offload.Meta) {
	h, ok := checkRXMeta(frame, proto, m)
	if !ok {
		e.counters.rxDroppedOffload.Add(1)
		return
	}
	if m.GSO == offload.GSOUDPL4 {
		e.deliverCut(dp, proto, kind, frame, h, int(m.GSOSize))
		return
	}
	if m.GSO != offload.GSONone {
		e.counters.rxSuperFrames.Add(1)
	}
	if m.NeedsCsum && e.caps&stack.CapabilityRXChecksumOffload == 0 {
		e.deliverCompleted(dp, proto, kind, frame, int(m.CsumStart), int(m.CsumOffset))
		return
	}
	e.deliver(dp, proto, kind, frame)
}

// deliverCompleted delivers a frame whose partial checksum the stack would
// refuse, completed. The caller's frame stays as it is: the completed sum
// goes into the copy the stack gets. A large frame's headers, the checksum
// field among them, are copied apart and patched there (the payload chunk
// is copied once, as rxBuffer copies it); a small one is patched whole in
// rxFrame. The caller holds writeMu.
func (e *endpoint) deliverCompleted(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, frame []byte, start, off int) {
	sum := offload.PartialSum(frame, start, off)
	split := headersLen(frame, uint16(proto))
	if at := start + off; split > 0 && at+2 <= split && len(frame)-split >= splitMinPayload {
		hdr := e.rxHeaders[:split]
		copy(hdr, frame)
		binary.BigEndian.PutUint16(hdr[at:], sum)
		buf := buffer.MakeWithData(hdr)
		buf.Append(buffer.NewViewWithData(frame[split:]))
		e.deliverBuffer(dp, proto, kind, buf, len(frame))
		return
	}
	f := e.rxScratch(len(frame))
	copy(f, frame)
	binary.BigEndian.PutUint16(f[start+off:], sum)
	e.deliver(dp, proto, kind, f)
}

// deliverCut cuts a super frame the stack does not take whole into its
// segments, each with complete checksums, and delivers them in order.
func (e *endpoint) deliverCut(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, frame []byte, h offload.Headers, mss int) {
	f := e.rxScratch(maxFrameSize)
	for i := range h.Segments(mss) {
		n, err := h.SegmentInto(f, frame, mss, i, true)
		if err != nil {
			// checkRXMeta bounded the frame by maxFrameSize; cannot happen.
			e.counters.rxDroppedOffload.Add(1)
			return
		}
		e.deliver(dp, proto, kind, f[:n])
	}
	e.counters.rxResegmented.Add(1)
}

// rxScratch returns the reusable receive scratch, at least n bytes. The
// caller holds writeMu.
func (e *endpoint) rxScratch(n int) []byte {
	if len(e.rxFrame) < maxFrameSize {
		e.rxFrame = make([]byte, maxFrameSize)
	}
	return e.rxFrame[:n]
}

// checkRXMeta checks m against the frame it describes, as the kernel's
// virtio_net_hdr_to_skb checks a vnet header: a partial checksum's offsets
// inside the frame, behind the link header; GSO only with a partial
// checksum, a positive size, on a packet offload.Parse takes of the kind
// it names. It returns the parsed headers of a GSO frame.
func checkRXMeta(frame []byte, proto tcpip.NetworkProtocolNumber, m offload.Meta) (offload.Headers, bool) {
	var h offload.Headers
	if len(frame) > maxFrameSize {
		return h, false
	}
	if m.NeedsCsum && (int(m.CsumStart) < ethernetHeaderLen || int(m.CsumStart)+int(m.CsumOffset)+2 > len(frame)) {
		return h, false
	}
	if m.GSO == offload.GSONone {
		return h, true
	}
	if !m.NeedsCsum || m.GSOSize == 0 {
		return h, false
	}
	h, err := offload.Parse(frame, ethernetHeaderLen)
	if err != nil {
		return h, false
	}
	v6 := proto == header.IPv6ProtocolNumber
	switch m.GSO {
	case offload.GSOTCPv4:
		return h, h.Proto == offload.ProtoTCP && !v6 && !h.IPv6
	case offload.GSOTCPv6:
		return h, h.Proto == offload.ProtoTCP && v6 && h.IPv6
	case offload.GSOUDPL4:
		return h, h.Proto == offload.ProtoUDP && v6 == h.IPv6 && h.Segments(int(m.GSOSize)) <= udpMaxSegments
	}
	return h, false
}
