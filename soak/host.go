package soak

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/internal/packet"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// soakHost plays the host behind one Interface: an in-memory
// ipoibcm.HostPort that resolves peers with Ethernet ARP through the
// engine, queues soak packets for the engine to read, and checks every
// frame the engine writes back. It is far lighter than a gVisor stack, so
// a soak can run many of them.
type soakHost struct {
	idx   int
	mac   frame.MAC
	ip    netip.Addr
	batch int
	flows *soakFlows
	viol  *soakViolations
	// watch, if set, is told of every frame the engine writes, so it can
	// tell a delivered dead completion from a recycled one.
	watch *verbsWatch

	// mu guards queue and closed; readable and writable carry edge
	// signals (capacity 1) so waiters can also select on done.
	mu       sync.Mutex
	queue    []queuedFrame
	queueCap int
	closed   bool
	readable chan struct{}
	writable chan struct{}
	done     chan struct{}

	arpMu    sync.Mutex
	arp      map[netip.Addr]frame.MAC
	arpReply chan struct{} // an ARP reply was learned

	// rxMu serialises the receive-side checks (the engine already
	// serialises WriteFrames, this keeps the host correct on its own).
	rxMu    sync.Mutex
	lastSeq []uint64 // per source host: highest sequence number seen

	linkUp atomic.Bool
	mtu    atomic.Int64
	ctr    soakHostCounters
}

// soakHostCounters count what the host saw besides data.
type soakHostCounters struct {
	arpRequestsAnswered atomic.Uint64
	arpRepliesLearned   atomic.Uint64
	icmp                atomic.Uint64 // frag-needed from the engine (UD path MTU)
	ignored             atomic.Uint64 // IPv6 and other frames the soak does not send
}

// queuedFrame is a frame waiting for ReadFrames; dst is the flow's
// destination host for a soak packet, -1 for ARP.
type queuedFrame struct {
	b   []byte
	dst int
}

var _ ipoibcm.HostPort = (*soakHost)(nil)

func newSoakHost(idx, batch, queueCap int, flows *soakFlows, viol *soakViolations) *soakHost {
	return &soakHost{
		idx:      idx,
		mac:      frame.MAC{0x02, 0x50, 0x4b, 0, byte(idx >> 8), byte(idx)},
		ip:       soakHostIP(idx),
		batch:    batch,
		flows:    flows,
		viol:     viol,
		queueCap: queueCap,
		readable: make(chan struct{}, 1),
		writable: make(chan struct{}, 1),
		done:     make(chan struct{}),
		arp:      make(map[netip.Addr]frame.MAC),
		arpReply: make(chan struct{}, 1),
		lastSeq:  make([]uint64, flows.hosts),
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// ReadFrames blocks until a frame is queued or the host is closed. A frame
// handed over counts as sent for its flow: from here on the engine either
// delivers it or counts it under a drop reason.
func (h *soakHost) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	h.mu.Lock()
	for len(h.queue) == 0 && !h.closed {
		h.mu.Unlock()
		select {
		case <-h.readable:
		case <-h.done:
		}
		h.mu.Lock()
	}
	if h.closed {
		h.mu.Unlock()
		return 0, fmt.Errorf("soak host %d: read: %w", h.idx, net.ErrClosed)
	}
	n := min(len(bufs), len(sizes), len(h.queue))
	for k := range n {
		q := h.queue[k]
		sizes[k] = copy(bufs[k], q.b)
		if q.dst >= 0 {
			h.flows.sent(h.idx, q.dst)
		}
	}
	rest := copy(h.queue, h.queue[n:])
	clear(h.queue[rest:])
	h.queue = h.queue[:rest]
	more := rest > 0
	h.mu.Unlock()
	signal(h.writable)
	if more {
		signal(h.readable)
	}
	return n, nil
}

// enqueue queues a frame for the engine, waiting for room unless urgent
// (replies made on the engine's RX poller must never wait for the engine's
// reader). It reports false once the host is closed or stop closes.
func (h *soakHost) enqueue(q queuedFrame, urgent bool, stop <-chan struct{}) bool {
	h.mu.Lock()
	for !urgent && len(h.queue) >= h.queueCap && !h.closed {
		h.mu.Unlock()
		select {
		case <-h.writable:
		case <-h.done:
		case <-stop:
			return false
		}
		h.mu.Lock()
	}
	if h.closed {
		h.mu.Unlock()
		return false
	}
	h.queue = append(h.queue, q)
	h.mu.Unlock()
	signal(h.readable)
	return true
}

// queued is the number of frames the engine has not read yet.
func (h *soakHost) queued() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.queue)
}

// WriteFrames checks every frame the engine hands the host. It never
// retains them.
func (h *soakHost) WriteFrames(frames [][]byte) (int, error) {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("soak host %d: write: %w", h.idx, net.ErrClosed)
	}
	if h.watch != nil {
		h.watch.delivered(frames)
	}
	h.rxMu.Lock()
	defer h.rxMu.Unlock()
	for _, f := range frames {
		h.receive(f)
	}
	return len(frames), nil
}

// receive checks one frame; under rxMu.
func (h *soakHost) receive(f []byte) {
	eth, err := frame.ParseEthernet(f)
	if err != nil {
		h.viol.record(violBadFrame, fmt.Sprintf("host %d: ethernet: %v", h.idx, err))
		return
	}
	if eth.Dst != h.mac && !eth.Dst.IsMulticast() {
		h.viol.record(violBadFrame, fmt.Sprintf("host %d: frame for %s, host MAC %s", h.idx, eth.Dst, h.mac))
		return
	}
	body := f[frame.EthHdrLen:]
	switch eth.EtherType {
	case frame.EtherTypeARP:
		h.receiveARP(eth, body)
	case frame.EtherTypeIPv4:
		h.receiveIPv4(eth, body)
	default:
		h.ctr.ignored.Add(1)
	}
}

func (h *soakHost) receiveIPv4(eth frame.EthHeader, ip []byte) {
	if len(ip) >= header.IPv4MinimumSize && header.IPv4(ip).Protocol() == packet.ProtoICMPv4 {
		h.ctr.icmp.Add(1) // frag-needed: the engine's PMTU answer
		return
	}
	p, err := parseSoakIPv4(ip)
	if err != nil {
		h.viol.record(violPayload, fmt.Sprintf("host %d: packet from %s: %v", h.idx, eth.Src, err))
		return
	}
	if int(p.Dst) != h.idx || p.DstIP != h.ip || int(p.Src) >= len(h.lastSeq) {
		h.viol.record(violPayload, fmt.Sprintf("host %d: packet of flow %d->%d (to %s) delivered here", h.idx, p.Src, p.Dst, p.DstIP))
		return
	}
	if src, ok := soakHostIndex(p.SrcIP); !ok || src != int(p.Src) {
		h.viol.record(violPayload, fmt.Sprintf("host %d: flow %d->%d from address %s", h.idx, p.Src, p.Dst, p.SrcIP))
		return
	}
	last := h.lastSeq[p.Src]
	if p.Seq <= last {
		h.viol.record(violOrder, fmt.Sprintf("host %d: flow %d->%d seq %d after %d", h.idx, p.Src, h.idx, p.Seq, last))
		return
	}
	h.lastSeq[p.Src] = p.Seq
	if !h.flows.received(int(p.Src), h.idx, p.Seq) {
		h.viol.record(violPayload, fmt.Sprintf("host %d: flow %d->%d seq %d never sent", h.idx, p.Src, h.idx, p.Seq))
	}
}

func (h *soakHost) receiveARP(eth frame.EthHeader, body []byte) {
	a, err := frame.ParseEthARP(body)
	if err != nil {
		h.viol.record(violBadFrame, fmt.Sprintf("host %d: ARP: %v", h.idx, err))
		return
	}
	switch a.Op {
	case frame.ARPRequest:
		if a.TargetIP != h.ip {
			return
		}
		reply := frame.EthARP{
			ARP:       frame.ARP{Op: frame.ARPReply, SenderIP: h.ip, TargetIP: a.SenderIP},
			SenderMAC: h.mac, TargetMAC: a.SenderMAC,
		}
		b := make([]byte, frame.EthHdrLen+frame.EthARPLen)
		frame.PutEthernet(b, frame.EthHeader{Dst: a.SenderMAC, Src: h.mac, EtherType: frame.EtherTypeARP})
		reply.Marshal(b[frame.EthHdrLen:])
		if h.enqueue(queuedFrame{b: b, dst: -1}, true, nil) {
			h.ctr.arpRequestsAnswered.Add(1)
		}
	case frame.ARPReply:
		if a.TargetIP != h.ip {
			return
		}
		if a.SenderMAC != eth.Src {
			h.viol.record(violBadFrame, fmt.Sprintf("host %d: ARP reply for %s names %s, frame from %s", h.idx, a.SenderIP, a.SenderMAC, eth.Src))
			return
		}
		h.arpMu.Lock()
		old, had := h.arp[a.SenderIP]
		h.arp[a.SenderIP] = a.SenderMAC
		h.arpMu.Unlock()
		if had && old != a.SenderMAC {
			// The engine maps a neighbour's MAC for its whole life; a
			// changed MAC breaks the host's ARP cache.
			h.viol.record(violBadFrame, fmt.Sprintf("host %d: %s moved from %s to %s", h.idx, a.SenderIP, old, a.SenderMAC))
		}
		h.ctr.arpRepliesLearned.Add(1)
		signal(h.arpReply)
	}
}

// lookupARP returns the MAC the engine gave for peer's address.
func (h *soakHost) lookupARP(ip netip.Addr) (frame.MAC, bool) {
	h.arpMu.Lock()
	defer h.arpMu.Unlock()
	m, ok := h.arp[ip]
	return m, ok
}

// arpRequest builds a broadcast who-has for ip.
func (h *soakHost) arpRequest(ip netip.Addr) []byte {
	b := make([]byte, frame.EthHdrLen+frame.EthARPLen)
	bcast := frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame.PutEthernet(b, frame.EthHeader{Dst: bcast, Src: h.mac, EtherType: frame.EtherTypeARP})
	req := frame.EthARP{ARP: frame.ARP{Op: frame.ARPRequest, SenderIP: h.ip, TargetIP: ip}, SenderMAC: h.mac}
	req.Marshal(b[frame.EthHdrLen:])
	return b
}

// dataFrame builds an Ethernet frame carrying soak packet seq of flow
// h.idx->dst, ipLen bytes of IP.
func (h *soakHost) dataFrame(dstMAC frame.MAC, dst int, seq uint64, ipLen int) []byte {
	b := make([]byte, frame.EthHdrLen+ipLen)
	frame.PutEthernet(b, frame.EthHeader{Dst: dstMAC, Src: h.mac, EtherType: frame.EtherTypeIPv4})
	putSoakIPv4(b[frame.EthHdrLen:], uint16(h.idx), uint16(dst), seq, ipLen)
	return b
}

func (h *soakHost) BatchSize() int            { return h.batch }
func (h *soakHost) HostMAC() net.HardwareAddr { return net.HardwareAddr(h.mac[:]) }

func (h *soakHost) SetMTU(mtu int) error {
	if mtu < 576 {
		return fmt.Errorf("soak host %d: MTU %d below 576: %w", h.idx, mtu, errSoakBadMTU)
	}
	h.mtu.Store(int64(mtu))
	return nil
}

var errSoakBadMTU = errors.New("MTU too small")

func (h *soakHost) SetLinkUp(up bool) error {
	h.linkUp.Store(up)
	return nil
}

// Close unblocks ReadFrames and the traffic generator. Frames still queued
// were never read by the engine and do not count as sent.
func (h *soakHost) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.queue = nil
	h.mu.Unlock()
	close(h.done)
	return nil
}
