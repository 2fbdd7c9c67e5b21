package ipoibcm

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/napi"
	"github.com/ipoibcm/ipoib/offload"
	"github.com/ipoibcm/ipoib/offload/gro"
)

// This file is the flow HCA → host. Its functions occur in the order in
// which a receive completion is processed:
//
//  1. poll: the RX poller (napi) hands handleRX up to a budget of
//     completions, under its poll lock;
//  2. sort by work request: the UD ring (rxUD), the SRQ (rxSRQ), a
//     non-SRQ connection's own ring (rxConnRing), or the drain WR, whose
//     completion goes to the passive set's reaper on the control loop;
//  3. dead check: a completion of a passive connection marked dead
//     (rxteardown.go, markDead) is recycled and counted rx_dead_dropped,
//     never delivered (deadCompletion);
//  4. deliver: the IPoIB message becomes an Ethernet frame for the host
//     in its receive buffer (deliverIP), or translated into a scratch
//     buffer for ARP (rxARPLocked) and neighbour discovery (deliverND),
//     learning neighbours under the neighbour table's lock, taken once
//     per batch on first need (lock), once per UD source and batch
//     (udNeighbour); the IP and transport headers are read once
//     (deliverIP) for the checks, the checksum verdict and GRO;
//  5. GRO: the batch's in-order TCP segments of a flow are coalesced for
//     a host that takes super frames (writeHost); after a poll that used
//     its whole budget on UD receives the chains still open stay, with
//     their receive buffers, until a poll completes (complete);
//  6. host write: the batch goes to the host in one write through the
//     hostWriter, with the neighbour table's lock already released;
//  7. repost: every buffer goes back to its ring (repost).
//
// The path never calls back into the TX side and never posts a send: ICMP
// answers are built by the TX side. Connection events go to the passive
// set's state machine on the control loop; nothing here waits.

// rxEnv is what the RX path works with, fixed at New: narrow pieces of
// the interface, never the Interface itself.
type rxEnv struct {
	poller  *napi.Context // the RX poller that calls handleRX
	mu      *sync.Mutex   // guards neigh (neighbourTable.mu)
	neigh   *neighbourTable
	passive *passiveSet  // connection events, the drain completion
	post    func(func()) // onto the control loop
	out     *hostSplit   // the host queues' writers
	off     *offloadPath
	ctr     *counters
	ud      *udPath
	srq     *srqRing // nil without SRQ
	// hostMAC is the destination of frames to the host; hostLink says
	// whether the host has ib0 down.
	hostMAC  *macCell
	hostLink *hostLinkCell
	// self is our hardware address: own echoes, ARP and ND targets.
	self frame.HWAddr
	// staleUpdate is Config.StaleUpdate: how often a connection's LRU
	// stamp is refreshed at most.
	staleUpdate time.Duration
	log         *slog.Logger
}

// rxPath is the RX poller's state: its environment and the reusable
// buffers of one handleRX call.
type rxPath struct {
	rxEnv
	selfGID hca.GID
	selfQPN hca.QPN

	frames [][]byte
	meta   []offload.Meta // frames' offload metadata, for an OffloadPort
	// hdrs is each frame's reading of its headers, taken once in
	// deliverIP for its checks and the checksum verdict and handed to
	// GRO (gro.Coalescer.AddHeaders), which would otherwise parse the
	// packet again.
	hdrs []rxHeaders
	// gro coalesces each batch's in-order TCP segments of a flow into
	// super frames for a host that takes them (nil otherwise); what it
	// emits collects in groOut/groMeta.
	gro     *gro.Coalescer
	groOut  [][]byte
	groMeta []offload.Meta
	groEmit func(frame []byte, m offload.Meta)
	// gather is the port when it writes frames in pieces: GRO then
	// gathers (no payload copy) and its frames collect in groVec.
	gather     GatherPort
	groVec     [][][]byte
	groEmitVec func(pieces [][]byte, m offload.Meta)
	udRepost   []hca.RecvWR
	srqRepost  []hca.RecvWR
	connRepost []connRepost
	// budget is the RX poll's; a batch of a whole budget means the poll
	// is exhausted and another follows at once. rcSeen: the batch had
	// completions of passive connections, whose buffers GRO never keeps
	// past the batch (a connection marked dead reclaims them).
	budget int
	rcSeen bool
	// holdMax bounds the UD buffers open chains keep out of the ring: two
	// budgets, at most half the ring. A gathering chain keeps every
	// segment's buffer until it is 64 KiB, so eight flows of small
	// segments would otherwise keep the whole ring (TestUDHeldBounded),
	// and the fabric drops every UD packet until a poll completes.
	holdMax int
	// udHeld are the UD receive buffers the open GRO chains kept from the
	// last flush (by index), udHolding those the running flush reports
	// (holdUD), and holding marks them, by index, while repost sorts the
	// batch's buffers: a held buffer goes back to the ring only once a
	// flush no longer reports it.
	udHeld, udHolding []int32
	holding           []bool

	// trans holds translated ARP/ND frames (they change size, so they
	// cannot be rewritten in the receive buffer).
	trans  [][]byte
	nTrans int

	locked bool // the neighbour table's lock held for lookups
	// lastSrc is the source of the batch's previous UD packet and the
	// neighbour learn made of it (udSource).
	lastSrc udSource
	now     time.Time
	haveNow bool
	macOf   func(frame.HWAddr) (frame.MAC, bool)
	holdUD  func(idx int32) // GRO's held: a UD buffer an open chain keeps
}

type connRepost struct {
	rc  *rxConn
	idx int
}

// rxHeaders is offload.ReadHeaders' reading of a frame for the host
// (read), or nothing for a frame translated into a scratch buffer, which
// GRO parses itself (ARP and neighbour discovery, none of them TCP). ud is
// the index of the frame's UD receive buffer, -1 if it has none.
type rxHeaders struct {
	h    offload.Headers
	l4   bool // a whole TCP or UDP packet
	read bool
	ud   int32
}

// udSource is a UD packet's source, its IP source address and the
// neighbour learn returned for them. A 64 KiB UD LSO arrives as 16
// packets from one source in one batch, and the batch holds the neighbour
// table's lock from its first UD packet on (lock), so nothing but the
// batch's own learning (rxPath.learn) can change what learn would find
// for the next packet of the same source: the map work is done once per
// source and batch, and the first packet of a batch still learns.
type udSource struct {
	gid hca.GID
	qpn hca.QPN
	ip  netip.Addr
	n   *neighbour
}

const transBufSize = 2048

func (r *rxPath) init(env rxEnv, batch int) error {
	r.rxEnv = env
	r.selfGID, r.selfQPN = env.self.GID(), env.self.QPN()
	r.budget = batch
	r.holdMax = min(2*batch, len(env.ud.bufs)/2)
	r.frames = make([][]byte, 0, batch)
	r.meta = make([]offload.Meta, 0, batch)
	r.hdrs = make([]rxHeaders, 0, batch)
	if o := env.off; o.port != nil && o.host.Csum && o.host.TSO4 && o.host.TSO6 {
		r.gather, _ = o.port.(GatherPort)
		c, err := gro.New(gro.Config{L3Off: frame.EthHdrLen, Batch: batch, Gather: r.gather != nil})
		if err != nil {
			return fmt.Errorf("gro: %w", err)
		}
		r.gro = c
		r.groOut = make([][]byte, 0, batch)
		r.groMeta = make([]offload.Meta, 0, batch)
		r.groEmit = func(f []byte, m offload.Meta) {
			r.groOut = append(r.groOut, f)
			r.groMeta = append(r.groMeta, m)
		}
		r.groVec = make([][][]byte, 0, batch)
		r.groEmitVec = func(pieces [][]byte, m offload.Meta) {
			r.groVec = append(r.groVec, pieces)
			r.groMeta = append(r.groMeta, m)
		}
		r.holding = make([]bool, len(env.ud.bufs))
		r.udHeld = make([]int32, 0, batch)
		r.udHolding = make([]int32, 0, batch)
		r.holdUD = func(idx int32) {
			r.holding[idx] = true
			r.udHolding = append(r.udHolding, idx)
		}
	}
	r.udRepost = make([]hca.RecvWR, 0, batch)
	r.srqRepost = make([]hca.RecvWR, 0, batch)
	r.connRepost = make([]connRepost, 0, batch)
	r.trans = make([][]byte, batch)
	for k := range r.trans {
		r.trans[k] = make([]byte, transBufSize)
	}
	r.macOf = func(hw frame.HWAddr) (frame.MAC, bool) {
		if hw.GID() == r.selfGID {
			return r.hostMAC.load(), true
		}
		n := r.learn(hw, netip.Addr{})
		if n == nil {
			return frame.MAC{}, false
		}
		return n.mac, true
	}
	return nil
}

// 1. Poll.

// handleRX is the RX poller's Handle: UD receives, passive-connection
// receives (SRQ or own ring) and the drain completion.
func (r *rxPath) handleRX(wcs []hca.WC) {
	if r.poller.Inline() {
		// On the poster's goroutine (Config.InlineRX), which may hold
		// a neighbour table's lock (ours, or a peer's that posts to us
		// while we post to it): take ours now or leave the batch to the
		// RX poller.
		if !r.mu.TryLock() {
			r.poller.Defer(wcs)
			return
		}
		r.locked = true
	}
	// 2. Sort by work request.
	for k := range wcs {
		wc := &wcs[k]
		if wc.ID == wrDrain {
			r.passive.drainPolled()
			continue
		}
		switch wrKind(wc.ID) {
		case wrKindUDRecv:
			r.rxUD(wc)
		case wrKindSRQRecv:
			r.rcSeen = true
			r.rxSRQ(wc)
		case wrKindConnRecv:
			r.rcSeen = true
			r.rxConnRing(wc)
		}
	}
	// A flush keeps at most what was held before and this batch: held
	// only while that stays within holdMax.
	r.flushRX(len(wcs) == r.budget && !r.rcSeen && len(r.udHeld)+len(wcs) <= r.holdMax)
}

// complete is the RX poller's Complete: a poll ended under its budget, so
// what GRO kept open from exhausted polls goes to the host now, as Linux's
// napi_complete_done flushes its GRO lists.
func (r *rxPath) complete() {
	if r.gro != nil && r.gro.Pending() > 0 {
		r.flushRX(false)
	}
}

func (r *rxPath) rxUD(wc *hca.WC) {
	idx := wrIndex(wc.ID)
	if idx >= len(r.ud.bufs) {
		return
	}
	b := r.ud.bufs[idx]
	r.udRepost = append(r.udRepost, hca.RecvWR{ID: wc.ID, Buf: b[headroom:]})
	if wc.Status != hca.StatusSuccess {
		if wc.Status != hca.StatusWRFlushErr {
			r.ctr.drop(dropRxError)
		}
		return
	}
	if wc.SrcQPN == r.selfQPN && wc.SrcGID == r.selfGID {
		r.ctr.drop(dropRxOwnEcho)
		return
	}
	if r.hostLink.down() {
		// ipoib_stop leaves the UD QP without receives; here the ring
		// stays posted and what arrives is counted, never learnt from.
		r.ctr.drop(dropRxLinkDown)
		return
	}
	if wc.ByteLen > len(b)-headroom {
		r.ctr.drop(dropRxTruncatedHeader)
		return
	}
	msg := b[headroom : headroom+wc.ByteLen]
	et, err := frame.ParseEncap(msg)
	if err != nil {
		r.ctr.drop(dropRxTruncatedHeader)
		return
	}
	r.lock()
	if et == frame.EtherTypeARP {
		r.rxARPLocked(msg[frame.EncapLen:])
		return
	}
	if et != frame.EtherTypeIPv4 && et != frame.EtherTypeIPv6 {
		r.ctr.drop(dropRxUnknownEthertype)
		return
	}
	n := r.udNeighbour(wc.SrcGID, wc.SrcQPN, ipSrc(et, msg[frame.EncapLen:]))
	if n == nil {
		r.ctr.drop(dropRxBadIP)
		return
	}
	r.deliverIP(b, wc.ByteLen, et, n.mac, int32(idx), wc.Flags)
}

// udNeighbour learns the source of a UD packet from gid and qpn whose IP
// source address is ip, under the neighbour table's lock: the UD source
// names the peer's port, its flags are whatever ARP/ND taught us. A packet
// from the batch's previous source and address gets what learn returned
// for that one (udSource).
func (r *rxPath) udNeighbour(gid hca.GID, qpn hca.QPN, ip netip.Addr) *neighbour {
	if c := &r.lastSrc; c.n != nil && c.gid == gid && c.qpn == qpn && c.ip == ip {
		return c.n
	}
	var flags byte
	if n := r.neigh.lookupGID(gid); n != nil {
		flags = n.hw.Flags()
	}
	n := r.learn(frame.NewHWAddr(flags, qpn, gid), ip)
	r.lastSrc = udSource{gid: gid, qpn: qpn, ip: ip, n: n}
	return n
}

// learn is every learning of the RX path (neighbourTable.learn at the
// batch's time): it may change the neighbour udNeighbour remembered, so
// that is forgotten first.
func (r *rxPath) learn(hw frame.HWAddr, ip netip.Addr) *neighbour {
	r.lastSrc = udSource{}
	return r.neigh.learn(hw, ip, r.clock())
}

func (r *rxPath) rxSRQ(wc *hca.WC) {
	idx := wrIndex(wc.ID)
	if r.srq == nil || idx >= len(r.srq.bufs) {
		return
	}
	r.srqRepost = append(r.srqRepost, r.srq.recvWR(idx))
	rc, _ := wc.Context.(*rxConn)
	if rc == nil {
		r.ctr.drop(dropRxFromUnknownConn)
		return
	}
	// 3. Dead check.
	if rc.dead.Load() {
		r.deadCompletion()
		return
	}
	if wc.Status != hca.StatusSuccess {
		if wc.Status != hca.StatusWRFlushErr {
			r.ctr.drop(dropRxError)
		}
		return
	}
	r.rxConnPacket(rc, r.srq.bufs[idx], idx, wc.ByteLen, wc.Flags)
}

func (r *rxPath) rxConnRing(wc *hca.WC) {
	rc, _ := wc.Context.(*rxConn)
	idx := wrIndex(wc.ID)
	if rc == nil || idx >= len(rc.ring) {
		r.ctr.drop(dropRxFromUnknownConn)
		return
	}
	// 3. Dead check (or a ring the QP flushed by itself).
	if rc.dead.Load() || wc.Status == hca.StatusWRFlushErr {
		if rc.dead.Load() {
			r.deadCompletion()
		}
		if !rc.dead.Load() {
			// Flushed while live: the QP errored under us; tear down.
			r.passive.postRX(rc, rxEvFlushedLive)
		}
		r.ringReceiveGone(rc)
		return
	}
	r.connRepost = append(r.connRepost, connRepost{rc: rc, idx: idx})
	if wc.Status != hca.StatusSuccess {
		r.ctr.drop(dropRxError)
		return
	}
	r.rxConnPacket(rc, rc.ring[idx], idx, wc.ByteLen, wc.Flags)
}

// deadCompletion recycles a completion of a connection marked dead: its
// buffer goes back (reposted by the caller), its packet never reaches the
// host.
func (r *rxPath) deadCompletion() { r.ctr.rxDeadDropped.Add(1) }

// ringReceiveGone counts down a non-SRQ connection's posted receives; at
// zero nothing of it can be in the CQ any more and it is reaped.
func (r *rxPath) ringReceiveGone(rc *rxConn) {
	if rc.recvCount.Add(-1) == 0 && rc.reapPosted.CompareAndSwap(false, true) {
		r.passive.postRX(rc, rxEvRingFlushed)
	}
}

// 4. Deliver.

// rxConnPacket delivers one message received on a passive connection.
func (r *rxPath) rxConnPacket(rc *rxConn, b []byte, idx, byteLen int, flags hca.WCFlags) {
	if !rc.established.Load() && rc.established.CompareAndSwap(false, true) {
		// First receive before the RTU: tell the CM (IBTA COMM_EST), from
		// the control loop, never holding the poll lock into the CM.
		if c := rc.cmConn; c != nil {
			r.post(c.NotifyEstablished)
		}
	}
	rc.active.touch(r.clock().UnixNano())
	if lruCheck(idx) {
		now := r.clock().UnixNano()
		if now-rc.stamp.Load() >= int64(r.staleUpdate) {
			rc.stamp.Store(now)
		}
	}
	if byteLen > len(b)-headroom {
		r.ctr.drop(dropRxTruncatedHeader)
		return
	}
	msg := b[headroom : headroom+byteLen]
	et, err := frame.ParseEncap(msg)
	if err != nil {
		r.ctr.drop(dropRxTruncatedHeader)
		return
	}
	if et != frame.EtherTypeIPv4 && et != frame.EtherTypeIPv6 {
		r.ctr.drop(dropRxUnknownEthertype)
		return
	}
	rc.packets.Add(1)
	rc.byts.Add(uint64(byteLen))
	r.deliverIP(b, byteLen, et, rc.mac, -1, flags)
}

// rxARPLocked answers nothing itself: it learns the sender and hands the
// host an Ethernet ARP with the sender's MAC (and the host's own MAC when
// the target is us).
func (r *rxPath) rxARPLocked(body []byte) {
	a, err := frame.ParseIPoIBARP(body)
	if err != nil {
		r.ctr.drop(dropRxBadARP)
		return
	}
	n := r.learn(a.SenderHW, a.SenderIP)
	if n == nil {
		r.ctr.drop(dropRxBadARP)
		return
	}
	var target frame.MAC
	switch {
	case a.TargetHW.GID() == r.selfGID && a.TargetHW.QPN() == r.selfQPN:
		target = r.hostMAC.load()
	case !a.TargetHW.IsZero():
		if t := r.neigh.lookupGID(a.TargetHW.GID()); t != nil {
			target = t.mac
		}
	}
	out := r.transBuf()
	if out == nil {
		r.ctr.drop(dropRxBadARP)
		return
	}
	eth := a.ToEthernet(n.mac, target)
	m := eth.Marshal(out[frame.EthHdrLen:])
	dst := frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if a.Op == arpOpReply {
		dst = r.hostMAC.load()
	}
	frame.PutEthernet(out, frame.EthHeader{Dst: dst, Src: n.mac, EtherType: frame.EtherTypeARP})
	r.frames = append(r.frames, out[:frame.EthHdrLen+m])
	r.meta = append(r.meta, offload.Meta{})
	r.hdrs = append(r.hdrs, rxHeaders{ud: -1})
	r.ctr.rxPackets.Add(1)
	r.ctr.rxBytes.Add(uint64(frame.EncapLen + len(body)))
}

// deliverIP turns the IPoIB message at b[headroom:headroom+byteLen] into
// an Ethernet frame for the host: in place (the Ethernet header is written
// over the headroom and the IPoIB header), or, for neighbour discovery,
// translated into a scratch buffer. flags is the HCA's checksum verdict
// (offloadPath.rxMeta). The headers are read once, here: the validity
// check, the verdict and GRO take that reading. udIdx is the index of b
// in the UD ring, -1 for a passive connection's buffer.
func (r *rxPath) deliverIP(b []byte, byteLen int, et uint16, srcMAC frame.MAC, udIdx int32, flags hca.WCFlags) {
	f := b[:headroom+byteLen]
	pkt := f[frame.EthHdrLen:]
	ud := udIdx >= 0
	hd := rxHeaders{read: true, ud: udIdx}
	var ipOK bool
	hd.h, ipOK, hd.l4 = offload.ReadHeaders(f, frame.EthHdrLen)
	if !validRead(et, &hd.h, ipOK) {
		r.ctr.drop(dropRxBadIP)
		return
	}
	dst := r.hostMAC.load()
	switch et {
	case frame.EtherTypeIPv4:
		if isIPv4Broadcast(pkt) {
			dst = frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			r.ctr.multicast.Add(1)
		}
	case frame.EtherTypeIPv6:
		if frame.IsND(pkt) {
			r.deliverND(pkt, byteLen, srcMAC)
			return
		}
	}
	if mac, ok := hostMulticastMAC(et, pkt); ok {
		dst = mac
		if ud {
			r.ctr.multicast.Add(1)
		}
	}
	frame.PutEthernet(b, frame.EthHeader{Dst: dst, Src: srcMAC, EtherType: et})
	var m offload.Meta
	if flags != 0 {
		m = r.off.rxMeta(f, flags, &hd.h, hd.l4)
	}
	r.frames = append(r.frames, f)
	r.meta = append(r.meta, m)
	r.hdrs = append(r.hdrs, hd)
	r.ctr.rxPackets.Add(1)
	r.ctr.rxBytes.Add(uint64(byteLen))
}

// deliverND rewrites IPoIB link-layer options to the neighbours' MACs,
// learning the hardware addresses they carry.
func (r *rxPath) deliverND(pkt []byte, byteLen int, srcMAC frame.MAC) {
	out := r.transBuf()
	if out == nil {
		r.ctr.drop(dropRxBadND)
		return
	}
	r.lock()
	n, info, err := frame.NDToEthernet(out[frame.EthHdrLen:], pkt, r.macOf)
	if err != nil {
		r.ctr.drop(dropRxBadND)
		return
	}
	if info.HasSourceLL {
		if nb := r.neigh.lookupGID(info.SourceHW.GID()); nb != nil {
			nb.addIP(ipv6Src(pkt))
		}
	}
	if info.HasTargetLL && info.Target.IsValid() {
		if nb := r.neigh.lookupGID(info.TargetHW.GID()); nb != nil {
			nb.addIP(info.Target)
		}
	}
	dst := r.hostMAC.load()
	if mac, ok := hostMulticastMAC(frame.EtherTypeIPv6, pkt); ok {
		dst = mac
	}
	frame.PutEthernet(out, frame.EthHeader{Dst: dst, Src: srcMAC, EtherType: frame.EtherTypeIPv6})
	r.frames = append(r.frames, out[:frame.EthHdrLen+n])
	r.meta = append(r.meta, offload.Meta{})
	r.hdrs = append(r.hdrs, rxHeaders{ud: -1})
	r.ctr.rxPackets.Add(1)
	r.ctr.rxBytes.Add(uint64(byteLen))
}

// flushRX ends a handleRX call: the neighbour table's lock goes first, then the batch
// goes to the host (GRO, one write) and the buffers back to their rings;
// keep leaves GRO's open chains, and the UD buffers they hold, for the
// next call.
func (r *rxPath) flushRX(keep bool) {
	if r.locked {
		r.mu.Unlock()
		r.locked = false
	}
	if len(r.frames) > 0 || (r.gro != nil && r.gro.Pending() > 0) {
		r.writeHost(keep)
	}
	r.repost()
	r.nTrans = 0
	r.haveNow = false
	r.lastSrc = udSource{}
	r.rcSeen = false
}

// 5. GRO and 6. host write.

// writeHost hands the batch to the host in one write, its TCP flows
// coalesced (Linux's napi_gro_receive after ipoib_ib_handle_rx_wc) when
// the host takes super frames: rx_packets counted the packets already,
// and the super frames are gathered from the receive buffers where the
// port can. No engine lock is held: the only lock across the write is the
// hostWriter's, which serialises the host port's writers. With keep, the
// chains still open stay in GRO (FlushOpen) with the UD buffers they hold
// (holdUD), so the next poll's segments of their flows join them: a poll
// of 64 completions cuts one 16-packet UD LSO in two otherwise.
func (r *rxPath) writeHost(keep bool) {
	frames, meta := r.frames, r.meta
	switch {
	case r.gro != nil && (len(frames) > 1 || keep || r.gro.Pending() > 0):
		for k := range frames {
			if hd := &r.hdrs[k]; hd.read {
				r.gro.AddHeaders(frames[k], meta[k], hd.h, hd.l4, hd.ud)
			} else {
				r.gro.Add(frames[k], meta[k])
			}
		}
		if r.gather != nil {
			if keep {
				r.gro.FlushVecOpen(r.groEmitVec, r.holdUD)
			} else {
				r.gro.FlushVec(r.groEmitVec)
			}
			r.out.writeGather(r.groVec, r.groMeta)
			break
		}
		if keep {
			r.gro.FlushOpen(r.groEmit, r.holdUD)
		} else {
			r.gro.Flush(r.groEmit)
		}
		r.out.writeMeta(r.groOut, r.groMeta)
	default:
		r.out.writeMeta(frames, meta)
	}
	clear(r.frames)
	r.frames = r.frames[:0]
	r.meta = r.meta[:0]
	r.hdrs = r.hdrs[:0]
	clear(r.groOut)
	r.groOut = r.groOut[:0]
	clear(r.groVec)
	r.groVec = r.groVec[:0]
	r.groMeta = r.groMeta[:0]
}

// 7. Repost.

// sortHeld takes the UD buffers open GRO chains still hold out of the
// batch's reposts and puts back those the last flush released.
func (r *rxPath) sortHeld() {
	out := r.udRepost[:0]
	for _, wr := range r.udRepost {
		if !r.holding[wrIndex(wr.ID)] {
			out = append(out, wr)
		}
	}
	for _, idx := range r.udHeld {
		if !r.holding[idx] {
			out = append(out, hca.RecvWR{ID: wrID(wrKindUDRecv, int(idx)), Buf: r.ud.bufs[idx][headroom:]})
		}
	}
	r.udRepost = out
	for _, idx := range r.udHolding {
		r.holding[idx] = false
	}
	r.udHeld, r.udHolding = r.udHolding, r.udHeld[:0]
}

// repost gives the batch's buffers back to the UD ring, the SRQ and the
// connections' own rings, once the host is done with them.
func (r *rxPath) repost() {
	if len(r.udHeld) > 0 || len(r.udHolding) > 0 {
		r.sortHeld()
	}
	if len(r.udRepost) > 0 {
		if _, err := r.ud.qp.PostRecv(r.udRepost); err != nil {
			r.log.Warn("repost UD receives", "err", err)
		}
		r.udRepost = r.udRepost[:0]
	}
	if len(r.srqRepost) > 0 {
		if _, err := r.srq.srq.PostRecv(r.srqRepost); err != nil {
			r.log.Warn("repost SRQ receives", "err", err)
		}
		r.srqRepost = r.srqRepost[:0]
	}
	for _, c := range r.connRepost {
		wr := [1]hca.RecvWR{c.rc.recvWR(c.idx)}
		if n, err := c.rc.qp.PostRecv(wr[:]); err != nil || n != 1 {
			// The receive is gone for good: count it as flushed.
			r.ringReceiveGone(c.rc)
		}
	}
	clear(r.connRepost)
	r.connRepost = r.connRepost[:0]
}

// The poller's helpers.

// lock takes the neighbour table's lock once per handleRX call, on first need; flushRX
// releases it before the host write.
func (r *rxPath) lock() {
	if !r.locked {
		r.mu.Lock()
		r.locked = true
	}
}

// clock is the batch's time, read once per handleRX call on first need.
func (r *rxPath) clock() time.Time {
	if !r.haveNow {
		r.now, r.haveNow = time.Now(), true
	}
	return r.now
}

// transBuf is a scratch buffer for a translated frame, nil when the
// batch has used them all.
func (r *rxPath) transBuf() []byte {
	if r.nTrans == len(r.trans) {
		return nil
	}
	r.nTrans++
	return r.trans[r.nTrans-1]
}
