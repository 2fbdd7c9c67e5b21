package netstack

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ipoibcm/ipoib/offload"
)

const ethernetHeaderLen = header.EthernetMinimumSize

// endpoint is the stack's NIC: an Ethernet link whose far end is
// ReadFrames/WriteFrames rather than a wire.
type endpoint struct {
	mac      tcpip.LinkAddress
	macBytes [6]byte
	mtu      atomic.Uint32
	caps     stack.LinkEndpointCapabilities
	gso      bool
	counters *counters

	// dispatcher is the stack's NIC; nil before Attach and after removal.
	dispatcher atomic.Pointer[stack.NetworkDispatcher]

	mu     sync.Mutex
	state  linkState     // guarded by mu
	queue  packetRing    // guarded by mu
	ready  chan struct{} // one token: the queue went non-empty
	closed chan struct{} // closed when state becomes linkClosed

	// readMu serialises readers so scratch can be reused without
	// allocating; ReadFrames copies outside mu so the stack is never held
	// up by a 64 KiB memcpy.
	readMu  sync.Mutex
	scratch []*stack.PacketBuffer // guarded by readMu
	cutter  segmenter             // guarded by readMu
	fragIDs fragRenumberer        // guarded by readMu

	// writeMu serialises writers so rxFrame can be reused.
	writeMu sync.Mutex
	// rxFrame holds a frame whose checksum the link completes, or one
	// segment of a super frame the stack does not take whole; it is
	// allocated on first use.
	rxFrame []byte // guarded by writeMu
	// gathered is the view writeGathered copied the frame being received
	// into, until rxBuf hands it to the stack.
	gathered *buffer.View // guarded by writeMu
	// accept is what the reader of ReadFramesMeta takes (SetOffloads).
	accept atomic.Pointer[offload.Caps]
	// rxVouched is set while deliverVouched delivers the one frame whose
	// checksum the writer vouched for. It is endpoint state, seen by every
	// caller of Capabilities, yet holds for that frame alone: the stack
	// reads the RX checksum bit in one place, nic.DeliverNetworkPacket
	// (gVisor's stack/nic.go), once per packet, into
	// pkt.RXChecksumValidated; every DeliverNetworkPacket into this NIC
	// comes from deliverBuffer, whose callers hold writeMu, as
	// deliverVouched does from set to clear, so no other packet is being
	// delivered here meanwhile; the stack's other Capabilities readers
	// (route.go, nic.go) test other bits; and the host's packets to its
	// own addresses never enter through the NIC (ipv4/ipv6
	// handleLocalPacket set the bit themselves).
	// TestVouchedConcurrentWriters races vouched and unvouched writers.
	rxVouched atomic.Bool
}

var (
	_ stack.LinkEndpoint       = (*endpoint)(nil)
	_ stack.GSOEndpoint        = (*endpoint)(nil)
	_ stack.QueueingDiscipline = (*endpoint)(nil)
)

func newEndpoint(cfg Config, c *counters) *endpoint {
	e := &endpoint{
		mac:      tcpip.LinkAddress(cfg.MAC),
		caps:     stack.CapabilityResolutionRequired,
		gso:      cfg.GSO,
		counters: c,
		queue:    newPacketRing(cfg.QueueLen),
		ready:    make(chan struct{}, 1),
		closed:   make(chan struct{}),
		scratch:  make([]*stack.PacketBuffer, cfg.BatchSize),
	}
	copy(e.macBytes[:], cfg.MAC)
	if cfg.TrustRXChecksums {
		e.caps |= stack.CapabilityRXChecksumOffload
	}
	if cfg.SkipTXChecksums {
		e.caps |= stack.CapabilityTXChecksumOffload
	}
	e.mtu.Store(uint32(cfg.MTU))
	return e
}

// MTU implements stack.LinkEndpoint. It is the IP MTU; the stack derives the
// TCP MSS of new connections from it.
func (e *endpoint) MTU() uint32 { return e.mtu.Load() }

// SetMTU implements stack.LinkEndpoint.
func (e *endpoint) SetMTU(mtu uint32) { e.mtu.Store(mtu) }

// MaxHeaderLength implements stack.LinkEndpoint.
func (*endpoint) MaxHeaderLength() uint16 { return ethernetHeaderLen }

// LinkAddress implements stack.LinkEndpoint.
func (e *endpoint) LinkAddress() tcpip.LinkAddress { return e.mac }

// SetLinkAddress implements stack.LinkEndpoint. The MAC is fixed at New: the
// engine learns it once from HostMAC.
func (*endpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint. TX checksum offload is
// claimed only with Config.SkipTXChecksums; otherwise frames leave with
// real checksums. RX checksum offload is claimed with
// Config.TrustRXChecksums, and otherwise only while a frame whose checksum
// the writer vouched for is being delivered: gVisor's NIC sets each
// received packet's RXChecksumValidated from this call (nic.go,
// DeliverNetworkPacket), and nothing else in the stack reads that bit.
func (e *endpoint) Capabilities() stack.LinkEndpointCapabilities {
	if e.rxVouched.Load() {
		return e.caps | stack.CapabilityRXChecksumOffload
	}
	return e.caps
}

// Attach implements stack.LinkEndpoint.
func (e *endpoint) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		e.dispatcher.Store(nil)
		return
	}
	e.dispatcher.Store(&d)
}

// IsAttached implements stack.LinkEndpoint.
func (e *endpoint) IsAttached() bool { return e.dispatcher.Load() != nil }

// Wait implements stack.LinkEndpoint. The endpoint owns no goroutines.
func (*endpoint) Wait() {}

// ARPHardwareType implements stack.LinkEndpoint.
func (*endpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }

// AddHeader implements stack.LinkEndpoint.
func (*endpoint) AddHeader(pkt *stack.PacketBuffer) {
	eth := header.Ethernet(pkt.LinkHeader().Push(ethernetHeaderLen))
	eth.Encode(&header.EthernetFields{
		SrcAddr: pkt.EgressRoute.LocalLinkAddress,
		DstAddr: pkt.EgressRoute.RemoteLinkAddress,
		Type:    pkt.NetworkProtocolNumber,
	})
}

// ParseHeader implements stack.LinkEndpoint.
func (*endpoint) ParseHeader(pkt *stack.PacketBuffer) bool {
	_, ok := pkt.LinkHeader().Consume(ethernetHeaderLen)
	return ok
}

// Close implements stack.LinkEndpoint and stack.QueueingDiscipline; the
// stack calls it when the NIC is removed. It is idempotent.
func (e *endpoint) Close() { e.shutdown() }

// SetOnCloseAction implements stack.LinkEndpoint. There is no device to
// destroy.
func (*endpoint) SetOnCloseAction(func()) {}

// gsoMaxSize bounds the TCP super frames gVisor's host GSO builds. gVisor
// keeps each segment's payload at most gsoMaxSize less 161
// (header.TCPTotalHeaderMaximumSize + 1, sender.sendData); this is the
// largest bound that still keeps a super frame with a 20-byte IPv4 header
// and a 60-byte TCP header within IPv4's 16-bit total length, as a super
// frame on a Linux TAP must be. 64 KiB - 1 would also do that, but hold
// less than one full segment at MTU 65520 and shrink every one.
const gsoMaxSize = 1<<16 - 1 + header.TCPTotalHeaderMaximumSize + 1 - header.IPv4MinimumSize - header.TCPHeaderMaximumSize

// GSOMaxSize implements stack.GSOEndpoint.
func (*endpoint) GSOMaxSize() uint32 { return gsoMaxSize }

// SupportedGSO implements stack.GSOEndpoint. With Config.GSO the stack
// uses host GSO: its TCP hands the link segments of up to 64 KiB with a
// partial checksum, for the reader (ReadFramesMeta) or the link itself
// (segmenter) to cut, as Linux's TCP hands a TSO device super frames.
func (e *endpoint) SupportedGSO() stack.SupportedGSO {
	if e.gso {
		return stack.HostGSOSupported
	}
	return stack.GSONotSupported
}

// WritePacket implements stack.QueueingDiscipline. The endpoint is its own
// NIC's qdisc: gVisor's default one wraps every packet in a fresh
// PacketBufferList (one allocation per packet) only to call WritePackets.
func (e *endpoint) WritePacket(pkt *stack.PacketBuffer) tcpip.Error {
	e.mu.Lock()
	state, queued := e.state, false
	if state == linkUp && !e.queue.full() {
		e.queue.push(pkt.IncRef())
		queued = true
	}
	e.mu.Unlock()
	if queued {
		e.wakeReader()
		return nil
	}
	return e.dropped(state, 1)
}

// WritePackets implements stack.LinkWriter: it queues each packet for
// ReadFrames. The caller keeps its own reference, so the queue takes one.
// A full queue drops the rest and returns ErrNoBufferSpace, which TCP treats
// as loss; see Config.QueueLen for why this never blocks.
func (e *endpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	list := pkts.AsSlice()
	e.mu.Lock()
	state := e.state
	n := 0
	if state == linkUp {
		for _, pkt := range list {
			if e.queue.full() {
				break
			}
			e.queue.push(pkt.IncRef())
			n++
		}
	}
	e.mu.Unlock()
	if n > 0 {
		e.wakeReader()
	}
	if n < len(list) {
		return n, e.dropped(state, len(list)-n)
	}
	return n, nil
}

// wakeReader leaves a token for a reader waiting on an empty queue.
func (e *endpoint) wakeReader() {
	select {
	case e.ready <- struct{}{}:
	default:
	}
}

// dropped counts n packets that could not be queued in state and returns
// the error the stack expects.
func (e *endpoint) dropped(state linkState, n int) tcpip.Error {
	switch state {
	case linkClosed:
		e.counters.txDroppedClosed.Add(uint64(n))
		return &tcpip.ErrClosedForSend{}
	case linkDown:
		e.counters.txDroppedLinkDown.Add(uint64(n))
		return &tcpip.ErrNoBufferSpace{}
	default:
		e.counters.txDroppedQueueFull.Add(uint64(n))
		return &tcpip.ErrNoBufferSpace{}
	}
}

// readFrames implements ReadFrames and ReadFramesMeta; a nil ctx waits
// until a frame arrives or the endpoint closes. meta, when not nil,
// receives each frame's offload metadata, and accept is what the reader
// takes (the zero Caps for a plain ReadFrames: complete MTU-sized frames).
func (e *endpoint) readFrames(ctx context.Context, bufs [][]byte, sizes []int, meta []offload.Meta, accept offload.Caps) (int, error) {
	limit := min(len(bufs), len(sizes))
	if meta != nil {
		limit = min(limit, len(meta))
	}
	if limit == 0 {
		return 0, nil
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	e.readMu.Lock()
	defer e.readMu.Unlock()
	if len(e.scratch) < limit {
		e.scratch = make([]*stack.PacketBuffer, limit)
	}
	out := txBatch{bufs: bufs[:limit], sizes: sizes[:limit], meta: meta}
	for {
		// Cuts left over from a segment the last call could not finish go
		// first, so the byte stream stays in order.
		e.emitCuts(&out)
		e.mu.Lock()
		if e.state == linkClosed {
			e.mu.Unlock()
			return 0, fmt.Errorf("netstack read frames: %w", net.ErrClosed)
		}
		mtu := int(e.mtu.Load())
		n := 0
		if !e.cutter.pending() {
			n = e.popFitting(e.scratch[:limit-out.n], mtu)
		}
		e.mu.Unlock()
		if n > 0 {
			e.copyOut(e.scratch[:n], &out, mtu, accept)
		}
		if out.n > 0 {
			return out.n, nil
		}
		select {
		case <-e.ready:
		case <-e.closed:
		case <-done:
			return 0, fmt.Errorf("netstack read frames: %w", ctx.Err())
		}
	}
}

// txBatch is the reader's buffers being filled by one readFrames call.
type txBatch struct {
	bufs  [][]byte
	sizes []int
	meta  []offload.Meta // nil for a plain ReadFrames
	n     int            // frames filled
}

func (b *txBatch) full() bool { return b.n == len(b.bufs) }

// put records frame n of size bytes with m.
func (b *txBatch) put(size int, m offload.Meta) {
	b.sizes[b.n] = size
	if b.meta != nil {
		b.meta[b.n] = m
	}
	b.n++
}

// popFitting pops up to len(dst) packets, stopping after the first one
// larger than the link MTU or than its GSO segment size: that one may be
// cut into several frames and takes the rest of the batch. The caller
// holds mu.
func (e *endpoint) popFitting(dst []*stack.PacketBuffer, ipMTU int) int {
	n := 0
	for n < len(dst) {
		if e.queue.popInto(dst[n:n+1]) == 0 {
			break
		}
		n++
		pkt := dst[n-1]
		if pkt.Size()-ethernetHeaderLen > ipMTU || pkt.GSOOptions.Type != stack.GSONone && pkt.Data().Size() > int(pkt.GSOOptions.MSS) {
			break
		}
	}
	return n
}

// copyOut serialises pkts into the batch and drops the queue's references.
// Each packet leaves as planTX says: whole with its metadata (a partial
// checksum the reader does not accept completed on the way), or cut by the
// segmenter (it can only be the last, see popFitting); whatever of a cut
// does not fit this batch is left for the next call.
func (e *endpoint) copyOut(pkts []*stack.PacketBuffer, out *txBatch, ipMTU int, accept offload.Caps) {
	var bytes uint64
	whole, super := 0, 0
	for i, pkt := range pkts {
		plan := planTX(pkt, ipMTU, accept)
		if plan.cut && e.loadCut(pkt, plan.mss, accept.Csum) {
			pkt.DecRef()
			pkts[i] = nil
			e.emitCuts(out)
			continue
		}
		buf := out.bufs[out.n]
		copied, full := copyPacket(buf, pkt)
		m := plan.meta
		switch {
		case copied < full:
			e.counters.txTruncated.Add(1)
			m = offload.Meta{}
		case m.NeedsCsum && !accept.Csum:
			offload.CompletePartial(buf[:copied], int(m.CsumStart), int(m.CsumOffset))
			m = offload.Meta{}
		}
		if m.GSO != offload.GSONone {
			super++
		}
		e.fragIDs.renumber(buf[:copied])
		out.put(copied, m)
		bytes += uint64(copied)
		whole++
		pkt.DecRef()
		pkts[i] = nil
	}
	e.counters.txPackets.Add(uint64(whole))
	e.counters.txBytes.Add(bytes)
	e.counters.txSuperFrames.Add(uint64(super))
}

// loadCut serialises a packet into the segmenter and reports whether it
// is a TCP segment the segmenter will cut. The caller holds readMu.
func (e *endpoint) loadCut(pkt *stack.PacketBuffer, mss int, partial bool) bool {
	if e.cutter.frame == nil {
		e.cutter = newSegmenter()
	}
	copied, full := copyPacket(e.cutter.frame, pkt)
	if copied < full || !e.cutter.load(copied, mss, partial) {
		return false
	}
	e.counters.txResegmented.Add(1)
	return true
}

// emitCuts writes the segmenter's pending segments into the batch. The
// caller holds readMu.
func (e *endpoint) emitCuts(out *txBatch) {
	start := out.n
	var bytes uint64
	for !out.full() && e.cutter.pending() {
		n, m := e.cutter.cut(out.bufs[out.n])
		if n == 0 {
			// The reader's buffers are smaller than the MTU it set:
			// drop the rest of the segment, as a truncating read would.
			e.cutter.drop()
			e.counters.txTruncated.Add(1)
			break
		}
		out.put(n, m)
		bytes += uint64(n)
	}
	e.counters.txPackets.Add(uint64(out.n - start))
	e.counters.txBytes.Add(bytes)
}

// writeFrames delivers frames to the stack, each with meta[i] (all zero
// when meta is nil). Each frame is copied into pooled gVisor chunks
// (rxBuffer), so the caller's slices are free on return.
func (e *endpoint) writeFrames(frames [][]byte, meta []offload.Meta) (int, error) {
	dp, err := e.writable(len(frames))
	if dp == nil {
		return len(frames), err
	}
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	for k, frame := range frames {
		var m offload.Meta
		if k < len(meta) {
			m = meta[k]
		}
		e.receive(*dp, frame, m)
	}
	return len(frames), nil
}

// writeGathered is writeFrames for frames given as pieces in order. Each
// frame's pieces are copied once, into one gVisor view (no chunk of ours
// in between), and that view becomes the packet's payload chunk
// (gatheredBuffer): a GRO super frame given as its headers plus each
// segment's payload where it was received crosses into the stack with a
// single copy of every byte.
func (e *endpoint) writeGathered(frames [][][]byte, meta []offload.Meta) (int, error) {
	dp, err := e.writable(len(frames))
	if dp == nil {
		return len(frames), err
	}
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	for k, pieces := range frames {
		var m offload.Meta
		if k < len(meta) {
			m = meta[k]
		}
		n := 0
		for _, p := range pieces {
			n += len(p)
		}
		if n > maxFrameSize {
			// Longer than any Ethernet frame the stack takes: drop it
			// before allocating for it.
			e.counters.rxDroppedOversize.Add(1)
			continue
		}
		if len(pieces) == 1 || n < ethernetHeaderLen {
			e.receive(*dp, pieces[0][:min(len(pieces[0]), n)], m)
			continue
		}
		v := buffer.NewView(n)
		for _, p := range pieces {
			v.Write(p)
		}
		e.counters.rxGathered.Add(1)
		e.gathered = v
		e.receive(*dp, v.AsSlice(), m)
		if e.gathered != nil {
			// Dropped, or delivered from a copy of its own (completed,
			// cut): the view was not handed over.
			e.gathered.Release()
			e.gathered = nil
		}
	}
	return len(frames), nil
}

// writable returns the stack's NIC when the link takes frames; otherwise
// nil, and the n frames are counted dropped, with an error when closed.
func (e *endpoint) writable(n int) (*stack.NetworkDispatcher, error) {
	e.mu.Lock()
	state := e.state
	e.mu.Unlock()
	switch state {
	case linkClosed:
		e.counters.rxDroppedClosed.Add(uint64(n))
		return nil, fmt.Errorf("netstack write frames: %w", net.ErrClosed)
	case linkDown:
		e.counters.rxDroppedLinkDown.Add(uint64(n))
		return nil, nil
	}
	if dp := e.dispatcher.Load(); dp != nil {
		return dp, nil
	}
	e.counters.rxDroppedLinkDown.Add(uint64(n))
	return nil, nil
}

// receive checks one frame and delivers it with its metadata m. The caller
// holds writeMu.
func (e *endpoint) receive(dp stack.NetworkDispatcher, frame []byte, m offload.Meta) {
	if len(frame) > maxFrameSize {
		e.counters.rxDroppedOversize.Add(1)
		return
	}
	proto, kind, err := e.classify(frame)
	if err != nil {
		return
	}
	if isStalePMTU(frame, int(e.mtu.Load())) {
		e.counters.rxDroppedStalePMTU.Add(1)
		return
	}
	if m == (offload.Meta{}) {
		e.deliver(dp, proto, kind, frame)
		return
	}
	e.deliverOffloaded(dp, proto, kind, frame, m)
}

// deliver hands one checked frame to the stack.
func (e *endpoint) deliver(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, frame []byte) {
	e.deliverBuffer(dp, proto, kind, e.rxBuf(frame, uint16(proto)), len(frame))
}

// rxBuf returns frame in a gVisor buffer: the view writeGathered copied it
// into, when frame is that view's bytes (the view is handed over), or else
// a copy (rxBuffer). The caller holds writeMu.
func (e *endpoint) rxBuf(frame []byte, proto uint16) buffer.Buffer {
	if v := e.gathered; v != nil && len(frame) > 0 && v.Size() == len(frame) && &v.AsSlice()[0] == &frame[0] {
		e.gathered = nil
		return gatheredBuffer(v, frame, proto)
	}
	return rxBuffer(frame, proto)
}

// deliverBuffer hands one checked frame, already in a gVisor buffer, to the
// stack.
func (e *endpoint) deliverBuffer(dp stack.NetworkDispatcher, proto tcpip.NetworkProtocolNumber, kind tcpip.PacketType, buf buffer.Buffer, size int) {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
	if !e.ParseHeader(pkt) {
		// classify checked the length; this cannot fail.
		pkt.DecRef()
		e.counters.rxDroppedRunt.Add(1)
		return
	}
	pkt.PktType = kind
	e.counters.rxPackets.Add(1)
	e.counters.rxBytes.Add(uint64(size))
	dp.DeliverNetworkPacket(proto, pkt)
	pkt.DecRef()
}

// classify parses a frame's Ethernet header and decides whether the stack
// should see it, counting the reason when not, as a NIC's address filter
// would.
func (e *endpoint) classify(frame []byte) (tcpip.NetworkProtocolNumber, tcpip.PacketType, error) {
	eh, err := parseEthernet(frame)
	if err != nil {
		e.counters.rxDroppedRunt.Add(1)
		return 0, 0, err
	}
	var kind tcpip.PacketType
	switch {
	case eh.broadcast():
		kind = tcpip.PacketBroadcast
	case eh.multicast():
		kind = tcpip.PacketMulticast
	case eh.dst == e.macBytes:
		kind = tcpip.PacketHost
	default:
		e.counters.rxDroppedOtherHost.Add(1)
		return 0, 0, ErrOtherHost
	}
	switch eh.proto {
	case header.IPv4ProtocolNumber, header.IPv6ProtocolNumber, header.ARPProtocolNumber:
		return eh.proto, kind, nil
	default:
		e.counters.rxDroppedEtherType.Add(1)
		return 0, 0, ErrUnknownEtherType
	}
}

// setLinkUp moves between linkUp and linkDown; closed stays closed.
func (e *endpoint) setLinkUp(up bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == linkClosed {
		return fmt.Errorf("netstack set link up=%t: %w", up, net.ErrClosed)
	}
	if up {
		e.state = linkUp
	} else {
		e.state = linkDown
	}
	return nil
}

func (e *endpoint) currentState() linkState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// shutdown moves to linkClosed, wakes readers and releases queued packets.
// It reports whether this call did the closing.
func (e *endpoint) shutdown() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == linkClosed {
		return false
	}
	e.state = linkClosed
	close(e.closed)
	e.queue.release()
	return true
}
