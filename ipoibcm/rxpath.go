package ipoibcm

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
	"github.com/ipoibcm/ipoib/offload/gro"
)

// rxPath is the flow HCA → host: the RX poller's Handle takes receive
// completions of the UD QP, of passive connections (SRQ or their own
// rings) and the drain WR, turns IPoIB messages into Ethernet frames in
// place (or translated, for ARP and ND) and writes them to the host in one
// batch per Handle call. It hands connection events to the control loop
// and never calls back into the TX side. Its fields are the poller's
// reusable state.
type rxPath struct {
	i *Interface

	frames [][]byte
	meta   []offload.Meta // frames' offload metadata, for an OffloadPort
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

	// trans holds translated ARP/ND frames (they change size, so they
	// cannot be rewritten in the receive buffer).
	trans  [][]byte
	nTrans int

	locked  bool // neighbourTable.mu held for neighbour lookups
	now     time.Time
	haveNow bool
	macOf   func(frame.HWAddr) (frame.MAC, bool)
}

type connRepost struct {
	rc  *rxConn
	idx int
}

const transBufSize = 2048

func (r *rxPath) init(batch int) error {
	r.frames = make([][]byte, 0, batch)
	r.meta = make([]offload.Meta, 0, batch)
	if o := &r.i.off; o.port != nil && o.host.Csum && o.host.TSO4 && o.host.TSO6 {
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
	}
	r.udRepost = make([]hca.RecvWR, 0, batch)
	r.srqRepost = make([]hca.RecvWR, 0, batch)
	r.connRepost = make([]connRepost, 0, batch)
	r.trans = make([][]byte, batch)
	for k := range r.trans {
		r.trans[k] = make([]byte, transBufSize)
	}
	return nil
}

func (r *rxPath) clock() time.Time {
	if !r.haveNow {
		r.now, r.haveNow = time.Now(), true
	}
	return r.now
}

func (r *rxPath) transBuf() []byte {
	if r.nTrans == len(r.trans) {
		return nil
	}
	r.nTrans++
	return r.trans[r.nTrans-1]
}

// lock takes the neighbour table's lock once per Handle call, on first
// need.
func (r *rxPath) lock() {
	i := r.i
	if !r.locked {
		i.neigh.mu.Lock()
		r.locked = true
	}
}

// handleRX is the RX poller's Handle: UD receives, passive-connection
// receives (SRQ or own ring) and the drain completion.
func (r *rxPath) handleRX(wcs []hca.WC) {
	i := r.i
	if i.rxNAPI.Inline() {
		// On the poster's goroutine (Config.InlineRX), which may hold
		// a neighbour table's lock (ours, or a peer's that posts to us
		// while we post to it): take ours now or leave the batch to the
		// RX poller.
		if !i.neigh.mu.TryLock() {
			i.rxNAPI.Defer(wcs)
			return
		}
		r.locked = true
	}
	for k := range wcs {
		wc := &wcs[k]
		if wc.ID == wrDrain {
			i.passive.reaper.ctr.drainsCompleted.Add(1)
			i.ctl.post(i.passive.onDrainDone)
			continue
		}
		switch wrKind(wc.ID) {
		case wrKindUDRecv:
			r.rxUD(wc)
		case wrKindSRQRecv:
			r.rxSRQ(wc)
		case wrKindConnRecv:
			r.rxConnRing(wc)
		}
	}
	r.flushRX()
}

// flushRX hands the batch to the host, then gives the buffers back.
func (r *rxPath) flushRX() {
	i := r.i
	if r.locked {
		i.neigh.mu.Unlock()
		r.locked = false
	}
	if len(r.frames) > 0 {
		frames, meta := r.frames, r.meta
		switch {
		case r.gro != nil && len(frames) > 1:
			// GRO (Linux's napi_gro_receive after ipoib_ib_handle_rx_wc):
			// rx_packets counted the packets already; the host gets the
			// batch's TCP flows coalesced, in one write, gathered from the
			// receive buffers where the port can.
			for k := range frames {
				r.gro.Add(frames[k], meta[k])
			}
			if r.gather != nil {
				r.gro.FlushVec(r.groEmitVec)
				i.hostOut.writeGather(r.gather, r.groVec, r.groMeta)
				break
			}
			r.gro.Flush(r.groEmit)
			i.hostOut.writeMeta(r.groOut, r.groMeta)
		default:
			i.hostOut.writeMeta(frames, meta)
		}
		clear(r.frames)
		r.frames = r.frames[:0]
		r.meta = r.meta[:0]
		clear(r.groOut)
		r.groOut = r.groOut[:0]
		clear(r.groVec)
		r.groVec = r.groVec[:0]
		r.groMeta = r.groMeta[:0]
	}
	if len(r.udRepost) > 0 {
		if _, err := i.ud.qp.PostRecv(r.udRepost); err != nil {
			i.log.Warn("repost UD receives", "err", err)
		}
		r.udRepost = r.udRepost[:0]
	}
	if len(r.srqRepost) > 0 {
		if _, err := i.srq.srq.PostRecv(r.srqRepost); err != nil {
			i.log.Warn("repost SRQ receives", "err", err)
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
	r.nTrans = 0
	r.haveNow = false
}

func (r *rxPath) rxUD(wc *hca.WC) {
	i := r.i
	idx := wrIndex(wc.ID)
	if idx >= len(i.ud.bufs) {
		return
	}
	b := i.ud.bufs[idx]
	r.udRepost = append(r.udRepost, hca.RecvWR{ID: wc.ID, Buf: b[headroom:]})
	if wc.Status != hca.StatusSuccess {
		if wc.Status != hca.StatusWRFlushErr {
			i.ctr.drop(dropRxError)
		}
		return
	}
	if wc.SrcQPN == i.ud.qp.QPN() && wc.SrcGID == i.port.GID {
		i.ctr.drop(dropRxOwnEcho)
		return
	}
	if i.hostDown() {
		// ipoib_stop leaves the UD QP without receives; here the ring
		// stays posted and what arrives is counted, never learnt from.
		i.ctr.drop(dropRxLinkDown)
		return
	}
	if wc.ByteLen > len(b)-headroom {
		i.ctr.drop(dropRxTruncatedHeader)
		return
	}
	msg := b[headroom : headroom+wc.ByteLen]
	et, err := frame.ParseEncap(msg)
	if err != nil {
		i.ctr.drop(dropRxTruncatedHeader)
		return
	}
	r.lock()
	if et == frame.EtherTypeARP {
		r.rxARPLocked(msg[frame.EncapLen:])
		return
	}
	if et != frame.EtherTypeIPv4 && et != frame.EtherTypeIPv6 {
		i.ctr.drop(dropRxUnknownEthertype)
		return
	}
	// The UD source names the peer's port; its flags are whatever ARP/ND
	// taught us.
	var flags byte
	if n := i.neigh.lookupGID(wc.SrcGID); n != nil {
		flags = n.hw.Flags()
	}
	src := frame.NewHWAddr(flags, wc.SrcQPN, wc.SrcGID)
	n := i.neigh.learn(src, ipSrc(et, msg[frame.EncapLen:]), r.clock())
	if n == nil {
		i.ctr.drop(dropRxBadIP)
		return
	}
	r.deliverIP(b, wc.ByteLen, et, n.mac, true, wc.Flags)
}

func (r *rxPath) rxSRQ(wc *hca.WC) {
	i := r.i
	idx := wrIndex(wc.ID)
	if i.srq == nil || idx >= len(i.srq.bufs) {
		return
	}
	r.srqRepost = append(r.srqRepost, i.srq.recvWR(idx))
	rc, _ := wc.Context.(*rxConn)
	if rc == nil {
		i.ctr.drop(dropRxFromUnknownConn)
		return
	}
	if rc.dead.Load() {
		r.deadCompletion()
		return
	}
	if wc.Status != hca.StatusSuccess {
		if wc.Status != hca.StatusWRFlushErr {
			i.ctr.drop(dropRxError)
		}
		return
	}
	r.rxConnPacket(rc, i.srq.bufs[idx], idx, wc.ByteLen, wc.Flags)
}

func (r *rxPath) rxConnRing(wc *hca.WC) {
	i := r.i
	rc, _ := wc.Context.(*rxConn)
	idx := wrIndex(wc.ID)
	if rc == nil || idx >= len(rc.ring) {
		i.ctr.drop(dropRxFromUnknownConn)
		return
	}
	if rc.dead.Load() || wc.Status == hca.StatusWRFlushErr {
		if rc.dead.Load() {
			r.deadCompletion()
		}
		if !rc.dead.Load() {
			// Flushed while live: the QP errored under us; tear down.
			i.passive.postRX(rc, rxEvFlushedLive)
		}
		r.ringReceiveGone(rc)
		return
	}
	r.connRepost = append(r.connRepost, connRepost{rc: rc, idx: idx})
	if wc.Status != hca.StatusSuccess {
		i.ctr.drop(dropRxError)
		return
	}
	r.rxConnPacket(rc, rc.ring[idx], idx, wc.ByteLen, wc.Flags)
}

// ringReceiveGone counts down a non-SRQ connection's posted receives; at
// zero nothing of it can be in the CQ any more and it is reaped.
func (r *rxPath) ringReceiveGone(rc *rxConn) {
	if rc.recvCount.Add(-1) == 0 && rc.reapPosted.CompareAndSwap(false, true) {
		r.i.passive.postRX(rc, rxEvRingFlushed)
	}
}

// deadCompletion recycles a completion of a connection marked dead: its
// buffer goes back (reposted by the caller), its packet never reaches the
// host.
func (r *rxPath) deadCompletion() { r.i.ctr.rxDeadDropped.Add(1) }

// rxConnPacket delivers one message received on a passive connection.
func (r *rxPath) rxConnPacket(rc *rxConn, b []byte, idx, byteLen int, flags hca.WCFlags) {
	i := r.i
	if !rc.established.Load() && rc.established.CompareAndSwap(false, true) {
		// First receive before the RTU: tell the CM (IBTA COMM_EST), from
		// the control loop, never holding the poll lock into the CM.
		if c := rc.cmConn; c != nil {
			i.ctl.post(c.NotifyEstablished)
		}
	}
	rc.active.touch(r.clock().UnixNano())
	if lruCheck(idx) {
		now := r.clock().UnixNano()
		if now-rc.stamp.Load() >= int64(i.cfg.StaleUpdate) {
			rc.stamp.Store(now)
		}
	}
	if byteLen > len(b)-headroom {
		i.ctr.drop(dropRxTruncatedHeader)
		return
	}
	msg := b[headroom : headroom+byteLen]
	et, err := frame.ParseEncap(msg)
	if err != nil {
		i.ctr.drop(dropRxTruncatedHeader)
		return
	}
	if et != frame.EtherTypeIPv4 && et != frame.EtherTypeIPv6 {
		i.ctr.drop(dropRxUnknownEthertype)
		return
	}
	rc.packets.Add(1)
	rc.byts.Add(uint64(byteLen))
	r.deliverIP(b, byteLen, et, rc.mac, false, flags)
}

// deliverIP turns the IPoIB message at b[headroom:headroom+byteLen] into
// an Ethernet frame for the host: in place (the Ethernet header is written
// over the headroom and the IPoIB header), or, for neighbour discovery,
// translated into a scratch buffer. flags is the HCA's checksum verdict
// (rxMeta).
func (r *rxPath) deliverIP(b []byte, byteLen int, et uint16, srcMAC frame.MAC, ud bool, flags hca.WCFlags) {
	i := r.i
	pkt := b[frame.EthHdrLen : headroom+byteLen]
	dst := i.hostMACNow()
	switch et {
	case frame.EtherTypeIPv4:
		if !validIPv4(pkt) {
			i.ctr.drop(dropRxBadIP)
			return
		}
		if isIPv4Broadcast(pkt) {
			dst = frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			i.ctr.multicast.Add(1)
		}
	case frame.EtherTypeIPv6:
		if !validIPv6(pkt) {
			i.ctr.drop(dropRxBadIP)
			return
		}
		if frame.IsND(pkt) {
			r.deliverND(pkt, byteLen, srcMAC)
			return
		}
	}
	if mac, ok := hostMulticastMAC(et, pkt); ok {
		dst = mac
		if ud {
			i.ctr.multicast.Add(1)
		}
	}
	frame.PutEthernet(b, frame.EthHeader{Dst: dst, Src: srcMAC, EtherType: et})
	f := b[:headroom+byteLen]
	var m offload.Meta
	if flags != 0 {
		m = i.rxMeta(f, flags)
	}
	r.frames = append(r.frames, f)
	r.meta = append(r.meta, m)
	i.ctr.rxPackets.Add(1)
	i.ctr.rxBytes.Add(uint64(byteLen))
}

// deliverND rewrites IPoIB link-layer options to the neighbours' MACs,
// learning the hardware addresses they carry.
func (r *rxPath) deliverND(pkt []byte, byteLen int, srcMAC frame.MAC) {
	i := r.i
	out := r.transBuf()
	if out == nil {
		i.ctr.drop(dropRxBadND)
		return
	}
	r.lock()
	if r.macOf == nil {
		r.macOf = func(hw frame.HWAddr) (frame.MAC, bool) {
			if hw.GID() == i.hw.GID() {
				return i.hostMACNow(), true
			}
			n := i.neigh.learn(hw, netip.Addr{}, r.clock())
			if n == nil {
				return frame.MAC{}, false
			}
			return n.mac, true
		}
	}
	n, info, err := frame.NDToEthernet(out[frame.EthHdrLen:], pkt, r.macOf)
	if err != nil {
		i.ctr.drop(dropRxBadND)
		return
	}
	if info.HasSourceLL {
		if nb := i.neigh.lookupGID(info.SourceHW.GID()); nb != nil {
			nb.addIP(ipv6Src(pkt))
		}
	}
	if info.HasTargetLL && info.Target.IsValid() {
		if nb := i.neigh.lookupGID(info.TargetHW.GID()); nb != nil {
			nb.addIP(info.Target)
		}
	}
	dst := i.hostMACNow()
	if mac, ok := hostMulticastMAC(frame.EtherTypeIPv6, pkt); ok {
		dst = mac
	}
	frame.PutEthernet(out, frame.EthHeader{Dst: dst, Src: srcMAC, EtherType: frame.EtherTypeIPv6})
	r.frames = append(r.frames, out[:frame.EthHdrLen+n])
	r.meta = append(r.meta, offload.Meta{})
	i.ctr.rxPackets.Add(1)
	i.ctr.rxBytes.Add(uint64(byteLen))
}

// rxARPLocked answers nothing itself: it learns the sender and hands the
// host an Ethernet ARP with the sender's MAC (and the host's own MAC when
// the target is us).
func (r *rxPath) rxARPLocked(body []byte) {
	i := r.i
	a, err := frame.ParseIPoIBARP(body)
	if err != nil {
		i.ctr.drop(dropRxBadARP)
		return
	}
	n := i.neigh.learn(a.SenderHW, a.SenderIP, r.clock())
	if n == nil {
		i.ctr.drop(dropRxBadARP)
		return
	}
	var target frame.MAC
	switch {
	case a.TargetHW.GID() == i.hw.GID() && a.TargetHW.QPN() == i.hw.QPN():
		target = i.hostMACNow()
	case !a.TargetHW.IsZero():
		if t := i.neigh.lookupGID(a.TargetHW.GID()); t != nil {
			target = t.mac
		}
	}
	out := r.transBuf()
	if out == nil {
		i.ctr.drop(dropRxBadARP)
		return
	}
	eth := a.ToEthernet(n.mac, target)
	m := eth.Marshal(out[frame.EthHdrLen:])
	dst := frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if a.Op == arpOpReply {
		dst = i.hostMACNow()
	}
	frame.PutEthernet(out, frame.EthHeader{Dst: dst, Src: n.mac, EtherType: frame.EtherTypeARP})
	r.frames = append(r.frames, out[:frame.EthHdrLen+m])
	r.meta = append(r.meta, offload.Meta{})
	i.ctr.rxPackets.Add(1)
	i.ctr.rxBytes.Add(uint64(frame.EncapLen + len(body)))
}
