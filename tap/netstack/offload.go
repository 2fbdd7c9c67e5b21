package netstack

import (
	"context"

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

// udpChecksumOffset is where the UDP header keeps its checksum (gVisor's
// header package does not export it).
const udpChecksumOffset = 6

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
// GRO that already happened stays done). A checksum the writer vouches for
// is not verified again, as Linux takes CHECKSUM_PARTIAL (veth) and
// CHECKSUM_UNNECESSARY (a NIC that verified it): a partial one (NeedsCsum
// at the TCP/UDP checksum field) and DataValid, on a whole TCP or UDP
// packet with a good IPv4 header checksum, are delivered with the stack
// told, for that frame alone, that the checksum is good (counted
// RxCsumVouched). Any other partial checksum is completed in a copy and
// verified by the stack, as are frames without metadata (unless the host
// trusts every received checksum, Config.TrustRXChecksums). A UDP super
// frame is cut into its datagrams. Metadata that contradicts its frame (a
// checksum offset outside it, GSO on a packet of another kind, GSO without
// a partial checksum, GSO size 0, a UDP super frame of more than 128
// datagrams) drops the frame, counted as RxDroppedOffload.
func (h *Host) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	return h.ep.writeFrames(frames, meta[:min(len(meta), len(frames))])
}

// WriteFramesGather is WriteFramesMeta for frames each given as pieces in
// order (a GRO super frame as its rebuilt headers and each segment's
// payload where it was received: ipoibcm's GatherPort). Each frame's
// pieces are copied once, straight into the gVisor chunk the stack keeps,
// and are free on return. A frame longer than 65535 bytes past its
// Ethernet header is dropped unread (RxDroppedOversize).
func (h *Host) WriteFramesGather(frames [][][]byte, meta []offload.Meta) (int, error) {
	return h.ep.writeGathered(frames, meta[:min(len(meta), len(frames))])
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
	switch {
	case e.caps&stack.CapabilityRXChecksumOffload != 0:
		e.deliver(dp, proto, kind, frame)
	case vouched(frame, proto, m):
		e.deliverVouched(dp, proto, kind, frame)
	case m.NeedsCsum:
		e.deliverCompleted(dp, proto, kind, frame, int(m.CsumStart), int(m.CsumOffset))
	default:
		e.deliver(dp, proto, kind, frame)
	}
}

// vouched reports whether the stack may take frame's TCP/UDP checksum as
// good without verifying it, as Linux takes CHECKSUM_PARTIAL and
// CHECKSUM_UNNECESSARY: m says the checksum is partial (never computed,
// the data having crossed only memory) with the offsets at the TCP/UDP
// checksum field, or DataValid (the HCA verified it). Only a whole TCP or
// UDP packet qualifies, no fragment (the verdict would carry over to the
// reassembled packet, whose other fragments nobody vouched for) and no
// IPv6 extension headers; and an IPv4 header checksum is checked here,
// since the stack's verdict covers it too while Linux checks it always.
// Anything else the stack verifies itself, a partial checksum completed
// first.
func vouched(frame []byte, proto tcpip.NetworkProtocolNumber, m offload.Meta) bool {
	if !m.NeedsCsum && !m.DataValid {
		return false
	}
	h, ok := parseFrameHeaders(frame, uint16(proto))
	if !ok {
		return false
	}
	if m.NeedsCsum {
		field := header.TCPChecksumOffset
		if h.transport == uint8(header.UDPProtocolNumber) {
			field = udpChecksumOffset
		}
		if int(m.CsumStart) != h.l4 || int(m.CsumOffset) != field {
			return false
		}
	}
	if proto == header.IPv4ProtocolNumber {
		return header.IPv4(frame[ethernetHeaderLen:h.l4]).IsChecksumValid()
	}
	return true
}

// deliverVouched delivers a frame vouched says the stack need not verify,
// with the stack told so for this frame alone. The caller holds writeMu,
// which keeps the claim to this one delivery.
func (e *endpoint) deliverVouched(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, frame []byte) {
	e.counters.rxCsumVouched.Add(1)
	e.rxVouched.Store(true)
	e.deliver(dp, proto, kind, frame)
	e.rxVouched.Store(false)
}

// deliverCompleted delivers a frame whose partial checksum the stack will
// verify, completed: a fragment, a packet behind IPv6 extension headers, or
// one whose checksum offsets or IPv4 header vouched refused. The caller's
// frame stays as it is: the completed sum goes into a copy (rxFrame). The
// caller holds writeMu.
func (e *endpoint) deliverCompleted(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, frame []byte, start, off int) {
	f := e.rxScratch(len(frame))
	copy(f, frame)
	offload.CompletePartial(f, start, off)
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
