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
// answer to the host (ICMP too-big), or a counted drop.

// txFrameLocked translates one host frame in pool buffer bufIdx and posts
// or parks it. It reports whether the buffer was consumed (posted or
// parked); otherwise the frame was dropped, counted, or answered locally.
// m is the frame's offload metadata (zero from a plain HostPort).
func (i *Interface) txFrameLocked(t *txScratch, bufIdx, size int, m offload.Meta, now time.Time) bool {
	b := i.tx.pool.bufs[bufIdx]
	if i.hostDown() {
		// The host set ib0 down (the kernel sends nothing then; these
		// were read before): netif_stop_queue.
		i.ctr.drop(dropTxLinkDown)
		return false
	}
	// A frame that filled its whole buffer was truncated by the host port.
	// A frame merely above our MTU (the host's MTU may be larger: a user
	// raised it, or segments queued before a mode switch) goes on to the
	// path check, which answers it with ICMP as Linux's ipoib_send does
	// through ipoib_cm_skb_too_long, instead of losing it silently.
	if size >= len(b) {
		i.ctr.txErrors.Add(1)
		i.ctr.drop(dropTxOversize)
		return false
	}
	f := b[:size]
	h, err := frame.ParseEthernet(f)
	if err != nil {
		if errors.Is(err, frame.ErrVLAN) {
			i.ctr.drop(dropTxVLAN)
		} else {
			i.ctr.drop(dropTxTruncated)
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
			i.ctr.drop(dropTxBadOffload)
			return false
		}
		if tm.gso() {
			i.off.ctr.txGSOFrames.Add(1)
		}
		return true
	}
	switch h.EtherType {
	case frame.EtherTypeARP:
		return i.txARPLocked(t, bufIdx, h, payload, now)
	case frame.EtherTypeIPv4:
		if !validIPv4(payload) {
			i.ctr.drop(dropTxNotIP)
			return false
		}
		if !checkMeta() {
			return false
		}
		if mayBeMcastReport(h.EtherType, payload) && i.mcast.hostReport(h.EtherType, payload, now) == mcastBadReport {
			i.ctr.drop(dropTxBadMcastReport)
			return false
		}
	case frame.EtherTypeIPv6:
		if !validIPv6(payload) {
			i.ctr.drop(dropTxNotIP)
			return false
		}
		if !checkMeta() {
			return false
		}
		if mayBeMcastReport(h.EtherType, payload) && i.mcast.hostReport(h.EtherType, payload, now) == mcastBadReport {
			i.ctr.drop(dropTxBadMcastReport)
			return false
		}
		if frame.IsND(payload) {
			// The rewrite computes the ICMPv6 checksum itself.
			tm = txMeta{}
			n, ok := i.txNDLocked(t, payload, now)
			if !ok {
				return false
			}
			size = frame.EthHdrLen + n
			payload = b[frame.EthHdrLen:size]
		}
	default:
		i.ctr.drop(dropTxUnknownEthertype)
		return false
	}
	if h.Dst.IsMulticast() {
		mgid, dst := i.mgidFor(h, payload)
		return i.txMulticastLocked(t, bufIdx, size, h.EtherType, mgid, dst, &tm, now)
	}
	n := i.neigh.lookupMAC(h.Dst)
	if n == nil {
		i.ctr.drop(dropTxUnknownNeighbour)
		return false
	}
	return i.txNeighLocked(t, n, bufIdx, size, h.EtherType, &tm, now)
}

// mgidFor maps a host multicast/broadcast frame to its group and IP
// destination: IP multicast destinations to their MGID (from the IP
// address: the MAC lost bits), everything else (broadcast, ARP) to the
// broadcast group, with no destination.
func (i *Interface) mgidFor(h frame.EthHeader, payload []byte) (hca.GID, netip.Addr) {
	switch h.EtherType {
	case frame.EtherTypeIPv4:
		if dst := ipv4Dst(payload); dst.IsMulticast() {
			return frame.MulticastMGID(dst, i.cfg.PKey), dst
		}
	case frame.EtherTypeIPv6:
		if dst := ipv6Dst(payload); dst.IsMulticast() {
			return frame.MulticastMGID(dst, i.cfg.PKey), dst
		}
	}
	return i.bcast, netip.Addr{}
}

// txNDLocked rewrites a host neighbour-discovery packet to IPoIB form (our
// hardware address in the link-layer options) in place, and joins the
// solicited-node group of the host address it reveals.
func (i *Interface) txNDLocked(t *txScratch, payload []byte, now time.Time) (int, bool) {
	n, info, err := frame.NDToIPoIB(t.nd, payload, i.hw)
	if err != nil {
		i.ctr.drop(dropTxBadND)
		return 0, false
	}
	src := ipv6Src(payload)
	if src.IsUnspecified() && info.Type == ndNeighborSolicit {
		src = info.Target // duplicate address detection: the tentative address
	}
	if src.IsValid() && !src.IsUnspecified() && !src.IsMulticast() {
		i.neigh.noteHostIP(src)
		i.mcast.membership(solicitedNode(src), true, now)
	}
	copy(payload[:cap(payload)][:n], t.nd[:n])
	return n, true
}

// txARPLocked turns a host Ethernet ARP packet into IPoIB ARP (hardware
// type 32, 20-byte addresses) in place and sends it over UD: to the
// broadcast group for requests the host broadcast, unicast to the
// neighbour behind the destination MAC otherwise.
func (i *Interface) txARPLocked(t *txScratch, bufIdx int, h frame.EthHeader, payload []byte, now time.Time) bool {
	a, err := frame.ParseEthARP(payload)
	if err != nil {
		i.ctr.drop(dropTxBadARP)
		return false
	}
	i.neigh.noteHostIP(a.SenderIP)
	var target frame.HWAddr
	if a.TargetMAC != (frame.MAC{}) {
		if n := i.neigh.lookupMAC(a.TargetMAC); n != nil {
			target = n.hw
		}
	}
	ib := a.ToIPoIB(i.hw, target)
	b := i.tx.pool.bufs[bufIdx]
	size := frame.EthHdrLen + ib.Marshal(b[frame.EthHdrLen:])
	var n *neighbour
	if !h.Dst.IsMulticast() {
		n = i.neigh.lookupMAC(h.Dst)
	}
	if n == nil {
		// A unicast request to a MAC we no longer map is the host
		// re-probing a stale ARP entry of an evicted neighbour: asking the
		// broadcast group instead lets the peer answer at once, with the
		// MAC it maps to now, rather than after the host gives up on
		// unicast probes. Anything else to an unknown MAC has no target.
		if !h.Dst.IsMulticast() && a.Op != frame.ARPRequest {
			i.ctr.drop(dropTxUnknownNeighbour)
			return false
		}
		ah, _, err := i.mcast.ah(i.bcast, netip.Addr{}, now)
		if err != nil {
			i.ctr.drop(dropTxNoAH)
			return false
		}
		return t.post.post(sendDest{ah: ah, qpn: hca.QPNMulticast}, bufIdx, size, frame.EtherTypeARP, sendOffload{})
	}
	n.lastUse = now
	ah, err := i.neigh.ah(n)
	if err != nil {
		i.ctr.drop(dropTxNoAH)
		return false
	}
	return t.post.post(sendDest{ah: ah, qpn: n.hw.QPN()}, bufIdx, size, frame.EtherTypeARP, sendOffload{})
}

func (i *Interface) txMulticastLocked(t *txScratch, bufIdx, size int, etherType uint16, mgid hca.GID, dst netip.Addr, tm *txMeta, now time.Time) bool {
	if tm.gso() {
		// Groups get no LSO: a multicast super frame (USO to a group) is
		// cut here, each datagram sent like one the host cut itself.
		if tm.segIPLen() > i.udMTU {
			i.ctr.txErrors.Add(1)
			i.ctr.drop(dropTxTooBig)
			return false
		}
		return i.txSegmentLocked(t, nil, mgid, dst, bufIdx, size, etherType, tm, now)
	}
	if size-frame.EthHdrLen > i.udMTU {
		i.ctr.txErrors.Add(1)
		i.ctr.drop(dropTxTooBig)
		return false
	}
	ah, ok, err := i.mcast.ah(mgid, dst, now)
	if !ok {
		i.ctr.drop(dropTxMcastTableFull)
		return false
	}
	if err != nil {
		i.ctr.drop(dropTxNoAH)
		return false
	}
	o := i.csumOffload(i.tx.pool.bufs[bufIdx][:size], tm)
	return t.post.post(sendDest{ah: ah, qpn: hca.QPNMulticast}, bufIdx, size, etherType, o)
}

// txNeighLocked sends a unicast frame to neighbour n: over its RC
// connection in connected mode when it has the 'C' flag (starting the
// connection and parking the frame if needed), else over UD. A super
// frame goes over UD as one LSO work request when the HCA can take it,
// in connected mode too (RC has no LSO; the host only sends super frames
// there before it heard the switch), and is cut in software otherwise; a
// partial checksum is left to the HCA (SendIPCsum) where it can fill it.
func (i *Interface) txNeighLocked(t *txScratch, n *neighbour, bufIdx, size int, etherType uint16, tm *txMeta, now time.Time) bool {
	n.lastUse = now
	f := i.tx.pool.bufs[bufIdx][:size]
	ipLen := size - frame.EthHdrLen
	lso := i.udLSOFits(size, tm)
	if i.useCMLocked(n, now) && !lso {
		tc := n.tx
		if tc == nil {
			tc = i.startTXLocked(n, now)
		}
		if tc != nil {
			switch tc.state.load() {
			case txUp:
				tc.active.touch(now.UnixNano())
				pathMTU := min(tc.mtu-frame.EncapLen, i.MTU())
				if tm.gso() {
					if tm.segIPLen() > pathMTU {
						i.tooBigLocked(t, n, bufIdx, size, pathMTU)
						return false
					}
					return i.txSegmentLocked(t, n, hca.GID{}, netip.Addr{}, bufIdx, size, etherType, tm, now)
				}
				if ipLen > pathMTU {
					i.tooBigLocked(t, n, bufIdx, size, pathMTU)
					return false
				}
				return t.post.post(sendDest{tc: tc}, bufIdx, size, etherType, i.csumOffload(f, tm))
			case txConnecting:
				// Parked frames are posted later without their Meta:
				// finish them now.
				if tm.gso() {
					return i.txSegmentLocked(t, n, hca.GID{}, netip.Addr{}, bufIdx, size, etherType, tm, now)
				}
				i.finishCsum(f, tm)
				return n.park(&i.tx, bufIdx, size)
			}
		}
	}
	pathMTU := min(i.udMTU, i.MTU())
	if tm.gso() {
		ipLen = tm.segIPLen()
	}
	if ipLen > pathMTU {
		i.tooBigLocked(t, n, bufIdx, size, pathMTU)
		return false
	}
	if tm.gso() && !lso {
		return i.txSegmentLocked(t, n, hca.GID{}, netip.Addr{}, bufIdx, size, etherType, tm, now)
	}
	ah, err := i.neigh.ah(n)
	if err != nil {
		i.ctr.drop(dropTxNoAH)
		return false
	}
	var o sendOffload
	if tm.gso() {
		o.mss = int(tm.m.GSOSize)
		o.segs = tm.hd.Segments(o.mss)
	} else {
		// After the AH, so a frame dropped for want of one is not counted
		// as checksummed.
		o = i.csumOffload(f, tm)
	}
	return t.post.post(sendDest{ah: ah, qpn: n.hw.QPN()}, bufIdx, size, etherType, o)
}

// udLSOFits reports whether a super frame of size bytes goes as one UD
// LSO work request: the HCA has LSO for it (hca.Offloads.PrepareLSO's
// checks) and its segments fit a UD datagram.
func (i *Interface) udLSOFits(size int, tm *txMeta) bool {
	return tm.gso() && size-headroom <= i.off.dev.UDLSOMaxSize &&
		tm.hd.Segments(int(tm.m.GSOSize)) <= hca.MaxLSOSegments && tm.segIPLen() <= i.udMTU
}

// txSegmentLocked cuts the super frame in pool buffer bufIdx into frames
// of at most its GSO size (offload.Segment, complete checksums) in fresh
// pool buffers, and sends each as the host's own frame would go: to n, or
// to group mgid when n is nil. The super frame's buffer is free again
// afterwards (it reports false). The segments need a credit and a buffer
// each, with a credit left for every frame still to come in the batch;
// when they are not there the super frame is dropped (tx_gso_no_room) and
// TCP resends it, rather than overrunning the send queue.
func (i *Interface) txSegmentLocked(t *txScratch, n *neighbour, mgid hca.GID, dst netip.Addr, bufIdx, size int, etherType uint16, tm *txMeta, now time.Time) bool {
	tx := &i.tx
	mss := int(tm.m.GSOSize)
	segs := tm.hd.Segments(mss)
	if segs > len(t.segIdx) || tx.creditsFree()-t.pending < segs {
		i.ctr.drop(dropTxGSONoRoom)
		return false
	}
	idx := t.segIdx[:segs]
	if got := tx.pool.take(idx); got < segs {
		tx.pool.put(idx[:got]...)
		i.ctr.drop(dropTxGSONoRoom)
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
			i.ctr.drop(dropTxBadOffload)
			return false
		}
		lens[k] = n
	}
	i.off.ctr.txSWSegmented.Add(1)
	i.off.ctr.txSWSegments.Add(uint64(segs))
	for k, j := range idx {
		// Segments are plain frames; t.plain, not a local, since the
		// recursion would move a local to the heap.
		t.plain = txMeta{}
		var sent bool
		if n == nil {
			sent = i.txMulticastLocked(t, j, lens[k], etherType, mgid, dst, &t.plain, now)
		} else {
			sent = i.txNeighLocked(t, n, j, lens[k], etherType, &t.plain, now)
		}
		if !sent {
			tx.pool.put1(j)
		}
	}
	return false
}

// tooBigLocked drops an IP packet larger than the path and answers the
// host with ICMP frag-needed / ICMPv6 packet-too-big carrying mtu.
func (i *Interface) tooBigLocked(t *txScratch, n *neighbour, bufIdx, size, mtu int) {
	b := i.tx.pool.bufs[bufIdx]
	if reply := i.answerTooBig(t.replyBuf(), n, b[frame.EthHdrLen:size], mtu); reply != nil {
		t.replies = append(t.replies, reply)
	}
}

// answerTooBig counts an IP packet too big for the path to n and builds
// the ICMP frag-needed / packet-too-big for the host into dst (nil: no
// room, counted all the same). It returns the reply, or nil.
func (i *Interface) answerTooBig(dst []byte, n *neighbour, pkt []byte, mtu int) []byte {
	i.ctr.txErrors.Add(1)
	i.ctr.drop(dropTxTooBig)
	if dst == nil {
		return nil
	}
	m := frame.BuildTooBig(dst, i.hostMACNow(), n.mac, pkt, mtu)
	if m == 0 {
		return nil
	}
	i.tx.ctr.tooBigSent.Add(1)
	return dst[:m]
}
