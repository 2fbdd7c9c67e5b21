package ipoibcm

import (
	"errors"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// This file is the middle of the flow host → HCA: one host Ethernet frame,
// read into a TX pool buffer, becomes an IPoIB send (posted through the
// reader's poster), a parked frame waiting for its connection, a local
// answer to the host (ICMP too-big), or a counted drop. Each step takes
// the lock of the owner it asks (the neighbour table, the multicast table)
// for as long as it asks, and posts after releasing it.

// frame translates one host frame in pool buffer bufIdx and posts or
// parks it. It reports whether the buffer was consumed (posted or
// parked); otherwise the frame was dropped, counted, or answered locally.
// m is the frame's offload metadata (zero from a plain HostPort).
func (r *hostReader) frame(bufIdx, size int, m offload.Meta, now time.Time) bool {
	b := r.tx.pool.bufs[bufIdx]
	if r.hostDown() {
		// The host set ib0 down (the kernel sends nothing then; these
		// were read before): netif_stop_queue.
		r.ctr.drop(dropTxLinkDown)
		return false
	}
	// A frame that filled its whole buffer was truncated by the host port.
	// A frame merely above our MTU (the host's MTU may be larger: a user
	// raised it, or segments queued before a mode switch) goes on to the
	// path check, which answers it with ICMP as Linux's ipoib_send does
	// through ipoib_cm_skb_too_long, instead of losing it silently.
	if size >= len(b) {
		r.ctr.txErrors.Add(1)
		r.ctr.drop(dropTxOversize)
		return false
	}
	f := b[:size]
	h, err := frame.ParseEthernet(f)
	if err != nil {
		if errors.Is(err, frame.ErrVLAN) {
			r.ctr.drop(dropTxVLAN)
		} else {
			r.ctr.drop(dropTxTruncated)
		}
		return false
	}
	payload := f[frame.EthHdrLen:]
	var tm txMeta
	checkMeta := func() bool {
		if m == (offload.Meta{}) {
			return true
		}
		var ok bool
		if tm, ok = checkTxMeta(f, m); !ok {
			r.ctr.drop(dropTxBadOffload)
			return false
		}
		if tm.gso() {
			r.off.ctr.txGSOFrames.Add(1)
		}
		return true
	}
	switch h.EtherType {
	case frame.EtherTypeARP:
		return r.arp(bufIdx, h, payload, now)
	case frame.EtherTypeIPv4:
		if !validIPv4(payload) {
			r.ctr.drop(dropTxNotIP)
			return false
		}
		if !checkMeta() {
			return false
		}
		if mayBeMcastReport(h.EtherType, payload) && r.mcast.hostReport(h.EtherType, payload, now) == mcastBadReport {
			r.ctr.drop(dropTxBadMcastReport)
			return false
		}
	case frame.EtherTypeIPv6:
		if !validIPv6(payload) {
			r.ctr.drop(dropTxNotIP)
			return false
		}
		if !checkMeta() {
			return false
		}
		if mayBeMcastReport(h.EtherType, payload) && r.mcast.hostReport(h.EtherType, payload, now) == mcastBadReport {
			r.ctr.drop(dropTxBadMcastReport)
			return false
		}
		if frame.IsND(payload) {
			// The rewrite computes the ICMPv6 checksum itself.
			tm = txMeta{}
			n, ok := r.nd(payload, now)
			if !ok {
				return false
			}
			size = frame.EthHdrLen + n
			payload = b[frame.EthHdrLen:size]
		}
	default:
		r.ctr.drop(dropTxUnknownEthertype)
		return false
	}
	if h.Dst.IsMulticast() {
		mgid, dst := r.mgidFor(h, payload)
		return r.multicast(bufIdx, size, h.EtherType, mgid, dst, &tm, now)
	}
	r.neigh.mu.Lock()
	n := r.neigh.lookupMAC(h.Dst)
	if n == nil {
		r.neigh.mu.Unlock()
		r.ctr.drop(dropTxUnknownNeighbour)
		return false
	}
	return r.unicastLocked(n, bufIdx, size, h.EtherType, &tm, now)
}

// mgidFor maps a host multicast/broadcast frame to its group and IP
// destination: IP multicast destinations to their MGID (from the IP
// address: the MAC lost bits), everything else (broadcast, ARP) to the
// broadcast group, with no destination.
func (r *hostReader) mgidFor(h frame.EthHeader, payload []byte) (hca.GID, netip.Addr) {
	switch h.EtherType {
	case frame.EtherTypeIPv4:
		if dst := ipv4Dst(payload); dst.IsMulticast() {
			return frame.MulticastMGID(dst, r.pkey), dst
		}
	case frame.EtherTypeIPv6:
		if dst := ipv6Dst(payload); dst.IsMulticast() {
			return frame.MulticastMGID(dst, r.pkey), dst
		}
	}
	return r.bcast, netip.Addr{}
}

// nd rewrites a host neighbour-discovery packet to IPoIB form (our
// hardware address in the link-layer options) in place, and joins the
// solicited-node group of the host address it reveals.
func (r *hostReader) nd(payload []byte, now time.Time) (int, bool) {
	t := &r.t
	n, info, err := frame.NDToIPoIB(t.nd, payload, r.hw)
	if err != nil {
		r.ctr.drop(dropTxBadND)
		return 0, false
	}
	src := ipv6Src(payload)
	if src.IsUnspecified() && info.Type == ndNeighborSolicit {
		src = info.Target // duplicate address detection: the tentative address
	}
	if src.IsValid() && !src.IsUnspecified() && !src.IsMulticast() {
		r.neigh.mu.Lock()
		r.neigh.noteHostIP(src)
		r.neigh.mu.Unlock()
		r.mcast.membership(solicitedNode(src), true, now)
	}
	copy(payload[:cap(payload)][:n], t.nd[:n])
	return n, true
}

// arp turns a host Ethernet ARP packet into IPoIB ARP (hardware type 32,
// 20-byte addresses) in place and sends it over UD: to the broadcast
// group for requests the host broadcast, unicast to the neighbour behind
// the destination MAC otherwise.
func (r *hostReader) arp(bufIdx int, h frame.EthHeader, payload []byte, now time.Time) bool {
	a, err := frame.ParseEthARP(payload)
	if err != nil {
		r.ctr.drop(dropTxBadARP)
		return false
	}
	var target frame.HWAddr
	var d sendDest
	var ahErr error
	r.neigh.mu.Lock()
	r.neigh.noteHostIP(a.SenderIP)
	if a.TargetMAC != (frame.MAC{}) {
		if n := r.neigh.lookupMAC(a.TargetMAC); n != nil {
			target = n.hw
		}
	}
	var n *neighbour
	if !h.Dst.IsMulticast() {
		n = r.neigh.lookupMAC(h.Dst)
	}
	if n != nil {
		n.lastUse = now
		d.ah, ahErr = r.neigh.ah(n)
		d.qpn = n.hw.QPN()
	}
	r.neigh.mu.Unlock()
	ib := a.ToIPoIB(r.hw, target)
	b := r.tx.pool.bufs[bufIdx]
	size := frame.EthHdrLen + ib.Marshal(b[frame.EthHdrLen:])
	if n == nil {
		// A unicast request to a MAC we no longer map is the host
		// re-probing a stale ARP entry of an evicted neighbour: asking the
		// broadcast group instead lets the peer answer at once, with the
		// MAC it maps to now, rather than after the host gives up on
		// unicast probes. Anything else to an unknown MAC has no target.
		if !h.Dst.IsMulticast() && a.Op != frame.ARPRequest {
			r.ctr.drop(dropTxUnknownNeighbour)
			return false
		}
		d.ah, _, ahErr = r.mcast.ah(r.bcast, netip.Addr{}, now)
		d.qpn = hca.QPNMulticast
	}
	if ahErr != nil {
		r.ctr.drop(dropTxNoAH)
		return false
	}
	return r.t.post.post(d, bufIdx, size, frame.EtherTypeARP, sendOffload{})
}

// multicast sends a frame to group mgid over UD.
func (r *hostReader) multicast(bufIdx, size int, etherType uint16, mgid hca.GID, dst netip.Addr, tm *txMeta, now time.Time) bool {
	if tm.gso() {
		// Groups get no LSO: a multicast super frame (USO to a group) is
		// cut here, each datagram sent like one the host cut itself.
		if tm.segIPLen() > r.udMTU {
			r.ctr.txErrors.Add(1)
			r.ctr.drop(dropTxTooBig)
			return false
		}
		return r.segment(nil, mgid, dst, bufIdx, size, etherType, tm, now)
	}
	if size-frame.EthHdrLen > r.udMTU {
		r.ctr.txErrors.Add(1)
		r.ctr.drop(dropTxTooBig)
		return false
	}
	ah, ok, err := r.mcast.ah(mgid, dst, now)
	if !ok {
		r.ctr.drop(dropTxMcastTableFull)
		return false
	}
	if err != nil {
		r.ctr.drop(dropTxNoAH)
		return false
	}
	o := r.off.csumOffload(r.tx.pool.bufs[bufIdx][:size], tm)
	return r.t.post.post(sendDest{ah: ah, qpn: hca.QPNMulticast}, bufIdx, size, etherType, o)
}

// useCMLocked reports whether frames to n go over an RC connection: in
// connected mode, to a peer advertising 'C', outside a CM back-off
// (neighbourTable.mu held).
func (r *hostReader) useCMLocked(n *neighbour, now time.Time) bool {
	return r.cm && Mode(r.mode.Load()) == ModeConnected && n.hw.Connected() && !now.Before(n.cmBackoffUntil)
}

// unicastLocked sends a frame to neighbour n: over its RC connection in
// connected mode when it has the 'C' flag (starting the connection and
// parking the frame if needed), else over UD. A super frame goes over UD
// as one LSO work request when the HCA can take it, in connected mode too
// (RC has no LSO; the host only sends super frames there before it heard
// the switch), and is cut in software otherwise; a partial checksum is
// left to the HCA (SendIPCsum) where it can fill it.
//
// It is entered with the neighbour table's lock held, chooses the route
// under it and releases it before anything is posted or answered (a
// connection's send slot is reserved under it).
func (r *hostReader) unicastLocked(n *neighbour, bufIdx, size int, etherType uint16, tm *txMeta, now time.Time) bool {
	f := r.tx.pool.bufs[bufIdx][:size]
	ipLen := size - frame.EthHdrLen
	mtu := int(r.mtu.Load())
	lso := r.udLSOFits(size, tm)
	n.lastUse = now
	if r.useCMLocked(n, now) && !lso {
		tc := n.tx
		if tc == nil {
			tc = r.conns.startLocked(n, now)
		}
		switch tc.state.load() {
		case txUp:
			tc.active.touch(now.UnixNano())
			pathMTU := min(tc.mtu-frame.EncapLen, mtu)
			if tm.gso() {
				r.neigh.mu.Unlock()
				if tm.segIPLen() > pathMTU {
					r.tooBig(n, bufIdx, size, pathMTU)
					return false
				}
				return r.segment(n, hca.GID{}, netip.Addr{}, bufIdx, size, etherType, tm, now)
			}
			if ipLen > pathMTU {
				r.neigh.mu.Unlock()
				r.tooBig(n, bufIdx, size, pathMTU)
				return false
			}
			if ch := tc.flushed; ch != nil {
				// Behind the parked frames the REP handler is posting:
				// once they are out, route the frame again.
				r.neigh.mu.Unlock()
				select {
				case <-ch:
				case <-r.stop:
					return false
				}
				r.neigh.mu.Lock()
				return r.unicastLocked(n, bufIdx, size, etherType, tm, now)
			}
			// The send slot, reserved where a teardown sees it.
			tc.outstanding.Add(1)
			r.neigh.mu.Unlock()
			return r.t.post.post(sendDest{tc: tc}, bufIdx, size, etherType, r.off.csumOffload(f, tm))
		case txConnecting:
			if tm.gso() {
				r.neigh.mu.Unlock()
				return r.segment(n, hca.GID{}, netip.Addr{}, bufIdx, size, etherType, tm, now)
			}
			// Parked frames are posted later without their Meta:
			// finish them now.
			r.off.finishCsum(f, tm)
			ok := n.park(r.tx, bufIdx, size)
			r.neigh.mu.Unlock()
			return ok
		}
	}
	pathMTU := min(r.udMTU, mtu)
	if tm.gso() {
		ipLen = tm.segIPLen()
	}
	if ipLen > pathMTU {
		r.neigh.mu.Unlock()
		r.tooBig(n, bufIdx, size, pathMTU)
		return false
	}
	if tm.gso() && !lso {
		r.neigh.mu.Unlock()
		return r.segment(n, hca.GID{}, netip.Addr{}, bufIdx, size, etherType, tm, now)
	}
	ah, err := r.neigh.ah(n)
	qpn := n.hw.QPN()
	r.neigh.mu.Unlock()
	if err != nil {
		r.ctr.drop(dropTxNoAH)
		return false
	}
	var o sendOffload
	if tm.gso() {
		o.mss = int(tm.m.GSOSize)
		o.segs = tm.hd.Segments(o.mss)
	} else {
		// After the AH, so a frame dropped for want of one is not counted
		// as checksummed.
		o = r.off.csumOffload(f, tm)
	}
	return r.t.post.post(sendDest{ah: ah, qpn: qpn}, bufIdx, size, etherType, o)
}

// udLSOFits reports whether a super frame of size bytes goes as one UD
// LSO work request: the HCA has LSO for it (hca.Offloads.PrepareLSO's
// checks) and its segments fit a UD datagram.
func (r *hostReader) udLSOFits(size int, tm *txMeta) bool {
	return tm.gso() && size-headroom <= r.off.dev.UDLSOMaxSize &&
		tm.hd.Segments(int(tm.m.GSOSize)) <= hca.MaxLSOSegments && tm.segIPLen() <= r.udMTU
}

// segment cuts the super frame in pool buffer bufIdx into frames of at
// most its GSO size (offload.Segment, complete checksums) in fresh pool
// buffers, and sends each as the host's own frame would go: to n, or to
// group mgid when n is nil. The super frame's buffer is free again
// afterwards (it reports false). The segments need a credit and a buffer
// each, with a credit left for every frame still to come in the batch;
// when they are not there the super frame is dropped (tx_gso_no_room) and
// TCP resends it, rather than overrunning the send queue.
func (r *hostReader) segment(n *neighbour, mgid hca.GID, dst netip.Addr, bufIdx, size int, etherType uint16, tm *txMeta, now time.Time) bool {
	tx, t := r.tx, &r.t
	mss := int(tm.m.GSOSize)
	segs := tm.hd.Segments(mss)
	if segs > len(t.segIdx) || tx.creditsFree()-t.pending < segs {
		r.ctr.drop(dropTxGSONoRoom)
		return false
	}
	idx := t.segIdx[:segs]
	if got := tx.pool.take(idx); got < segs {
		tx.pool.put(idx[:got]...)
		r.ctr.drop(dropTxGSONoRoom)
		return false
	}
	// checkTxMeta parsed the headers; cut with them rather than parsing
	// again (offload.Segment).
	lens := t.segLen[:segs]
	f := tx.pool.bufs[bufIdx][:size]
	for k, j := range idx {
		n, err := tm.hd.SegmentInto(tx.pool.bufs[j], f, mss, k, true)
		if err != nil {
			tx.pool.put(idx...)
			r.ctr.drop(dropTxBadOffload)
			return false
		}
		lens[k] = n
	}
	r.off.ctr.txSWSegmented.Add(1)
	r.off.ctr.txSWSegments.Add(uint64(segs))
	for k, j := range idx {
		// Segments are plain frames; t.plain, not a local, since the
		// recursion would move a local to the heap.
		t.plain = txMeta{}
		var sent bool
		if n == nil {
			sent = r.multicast(j, lens[k], etherType, mgid, dst, &t.plain, now)
		} else {
			r.neigh.mu.Lock()
			sent = r.unicastLocked(n, j, lens[k], etherType, &t.plain, now)
		}
		if !sent {
			tx.pool.put1(j)
		}
	}
	return false
}

// tooBig drops an IP packet larger than the path and answers the host
// with ICMP frag-needed / ICMPv6 packet-too-big carrying mtu.
func (r *hostReader) tooBig(n *neighbour, bufIdx, size, mtu int) {
	t := &r.t
	b := r.tx.pool.bufs[bufIdx]
	if reply := r.tx.answerTooBig(t.replyBuf(), n, b[frame.EthHdrLen:size], mtu); reply != nil {
		t.replies = append(t.replies, reply)
	}
}
