package ipoibcm

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// This file is the flow host → HCA. Its functions occur in the order in
// which a frame is processed:
//
//  1. host read: hostReader.run reads a batch of Ethernet frames into TX
//     pool buffers, within the TX credits (txqueue.go);
//  2. classify: hostReader.frame checks the frame and its offload metadata
//     and sorts it by EtherType and destination;
//  3. ARP/ND: hostReader.arp and hostReader.nd rewrite them to IPoIB form;
//  4. resolve: multicast frames get their group's address handle
//     (mcastTable.ah), unicast ones their neighbour and its route
//     (hostReader.unicastLocked: RC connection, parked while it comes up,
//     or UD), each under its owner's lock, released before the post;
//  5. route: UD, RC, one UD LSO work request, or cut in software
//     (hostReader.segment); too big for the path, an ICMP answer
//     (hostReader.tooBig);
//  6. post: poster.post, the one post function, takes a global credit;
//  7. send completion: txPath.handleTX gives buffers and credits back.
//
// No lock is held across a post or a host write; what a batch resolved
// stays valid until the batch ends (sendWindow, txqueue.go).

// 1. Host read.

// txScratch is the host reader's reusable state.
type txScratch struct {
	idx   []int
	bufs  [][]byte
	sizes []int
	meta  []offload.Meta // per frame; all zero from a plain HostPort
	free  []int
	// pending is how many frames of the batch follow the one being
	// sent: software segmentation leaves each of them a credit.
	pending int
	// claim is the credits the batch set aside (hostReader.claim) and
	// has not used yet: each send or parked frame of the batch takes its
	// credit out of it (poster.takeClaim), so other readers never see a
	// credit both outstanding and claimed. Always 0 for a lone reader.
	claim int
	// segIdx and segLen are software segmentation's pool buffers and
	// the segments' lengths.
	segIdx []int
	segLen []int
	plain  txMeta // a segment's (zero) metadata
	post   poster // reaps: the reader busy-polls the TX CQ
	nd     []byte // ND rewrite scratch

	// replies are frames for the host made while reading (ICMP too-big).
	replyBufs [][]byte
	replies   [][]byte
}

const replyBufSize = 1536 // an ICMPv6 packet-too-big quotes up to 1280 bytes

func (t *txScratch) init(tx *txPath, batch int) {
	t.idx = make([]int, batch)
	t.bufs = make([][]byte, batch)
	t.sizes = make([]int, batch)
	t.meta = make([]offload.Meta, batch)
	t.segIdx = make([]int, hca.MaxLSOSegments)
	t.segLen = make([]int, hca.MaxLSOSegments)
	t.free = make([]int, 0, batch)
	t.post = poster{tx: tx, reaps: true}
	t.nd = make([]byte, txBufSize)
	t.replyBufs = make([][]byte, batch)
	for k := range t.replyBufs {
		t.replyBufs[k] = make([]byte, replyBufSize)
	}
	t.replies = make([][]byte, 0, batch)
}

// replyBuf returns a free reply buffer, nil if the batch used them all.
func (t *txScratch) replyBuf() []byte {
	if len(t.replies) == len(t.replyBufs) {
		return nil
	}
	return t.replyBufs[len(t.replies)]
}

// hostReader is the start of the flow host → HCA: it reads batches of
// Ethernet frames from the host into TX pool buffers, has each translated
// and sent (frame, below) and stops reading while TX credits or
// buffers are exhausted. It holds no lock across a post or a host write:
// each frame is resolved under the owners' locks (the neighbour table's,
// the multicast table's) in short sections and posted after them; what a
// batch resolved stays valid until the batch ends (sendWindow).
//
// It also reaps send completions itself after each batch (napi BusyPoll),
// as mlx4/mlx5 reap TX completions in the transmit path: on the soft
// fabric a send usually completes inside PostSend, so the TX poller's
// goroutine is never woken for it. While it busy-polls the TX CQ stays
// unarmed; the reader hands re-arming back (EndBusyPoll) whenever it may
// block with sends outstanding, so a completion is never left unnoticed.
type hostReader struct {
	host  HostPort
	q     *hostQueue // the host queue it reads: its port, gate, window, writer
	off   *offloadPath
	tx    *txPath
	neigh *neighbourTable
	conns *activeSet
	mcast *mcastTable
	ctr   *counters
	stop  <-chan struct{}
	log   *slog.Logger

	// What the interface is, fixed at Start: our hardware address, the
	// broadcast group, the partition, the UD MTU, whether there is a CM.
	hw    frame.HWAddr
	bcast hca.GID
	pkey  hca.PKey
	udMTU int
	cm    bool
	// What the interface decides and the reader follows: the mode, the
	// IP MTU, the host's ib0 state.
	mode     *atomic.Int32
	mtu      *atomic.Int64
	hostDown func() bool
	// shared says other host readers share the credits (several host
	// queues): only then does a batch claim them.
	shared bool

	t txScratch
}

// newHostReader hands the reader of host queue q what it works with,
// from the interface it reads for (Start); it keeps no pointer to it.
func newHostReader(i *Interface, q *hostQueue) *hostReader {
	r := &hostReader{
		host: i.host, q: q, off: &i.off, tx: &i.tx, neigh: &i.neigh, conns: &i.active, mcast: &i.mcast,
		ctr: &i.ctr, stop: i.stop, log: i.log,
		hw: i.hw, bcast: i.bcast, pkey: i.cfg.PKey, udMTU: i.udMTU, cm: i.cmm != nil,
		mode: &i.mode, mtu: &i.mtu, hostDown: i.hostLink.down,
		shared: len(i.queues) > 1,
	}
	r.t.init(&i.tx, max(1, i.host.BatchSize()))
	if r.shared {
		r.t.post.claim = &r.t.claim
	}
	return r
}

// run is the reader's goroutine.
func (r *hostReader) run(done func()) {
	defer done()
	tx, q := r.tx, r.q
	defer tx.napi.EndBusyPoll() // the TX poller reaps whatever is left
	t := &r.t
	for {
		if !tx.waitCredits(&q.gate, r.off.segReserve) {
			return
		}
		want := min(len(t.idx), max(1, tx.creditsFree()))
		if rs := r.off.segReserve; rs > 0 {
			// Each frame may be a super frame to cut in software.
			want = min(want, max(1, tx.creditsFree()/rs))
		}
		n := tx.pool.take(t.idx[:want])
		if n == 0 {
			if tx.napi.BusyPoll() > 0 {
				continue // completions gave buffers back
			}
			// Every buffer is in flight: wait for completions like for
			// credits, with the TX CQ armed.
			if !tx.stopQueue(&q.gate, stopForBuffers) {
				return
			}
			continue
		}
		for k := range n {
			t.bufs[k] = tx.pool.bufs[t.idx[k]]
		}
		if tx.outstanding.Load() > 0 {
			// The read may block: completions still to come need the
			// completion event.
			tx.napi.EndBusyPoll()
		}
		var got int
		var err error
		if mr := q.read; mr != nil {
			got, err = mr.ReadFramesMeta(t.bufs[:n], t.sizes[:n], t.meta[:n])
		} else {
			got, err = r.host.ReadFrames(t.bufs[:n], t.sizes[:n])
		}
		if err != nil {
			tx.pool.put(t.idx[:n]...)
			select {
			case <-r.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("host read", "err", err)
			continue
		}
		got = min(got, n)
		q.countRead(t.sizes[:got])
		claim, ok := r.claim(got)
		if !ok {
			tx.pool.put(t.idx[:n]...)
			return
		}
		t.claim = claim
		now := time.Now()
		t.free = t.free[:0]
		t.replies = t.replies[:0]
		q.window.enter()
		for k := range got {
			t.pending = got - 1 - k
			if !r.frame(t.idx[k], t.sizes[k], t.meta[k], now) {
				t.free = append(t.free, t.idx[k])
			}
		}
		q.window.leave()
		tx.unclaim(t.claim)
		t.claim = 0
		t.free = append(t.free, t.idx[got:n]...)
		tx.pool.put(t.free...)
		if len(t.replies) > 0 {
			q.out.write(t.replies)
		}
		if got > 0 {
			tx.napi.BusyPoll()
		}
	}
}

// claim sets aside the credits of got frames just read (txPath.claim),
// waiting for completions while other readers' batches hold them; it
// reports false when the interface is stopping. A frame that software
// segmentation may cut counts as segReserve credits, as when the read
// was sized. A lone reader claims nothing: nobody else takes credits
// between its sizing and its sends (but for the control loop's rare ARP
// re-probe), so the credits are counted exactly as with one queue before
// claims, with no atomic operation more per batch or frame.
func (r *hostReader) claim(got int) (int, bool) {
	if !r.shared {
		return 0, true
	}
	tx := r.tx
	need := got * max(1, r.off.segReserve)
	have := tx.claim(need)
	for have < got {
		tx.unclaim(have)
		if !tx.stopQueue(&r.q.gate, stopForCredits) {
			return 0, false
		}
		have = tx.claim(need)
		if have < got {
			// The credits are back but other readers' batches hold
			// them: those never wait, so let them end.
			runtime.Gosched()
		}
	}
	return have, true
}

// 2. Classify.

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
	case frame.EtherTypeIPv4, frame.EtherTypeIPv6:
		v6 := h.EtherType == frame.EtherTypeIPv6
		if v6 && !validIPv6(payload) || !v6 && !validIPv4(payload) {
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
		if v6 && frame.IsND(payload) {
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

// 3. ARP and ND.

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

// 4 and 5. Resolve and route.

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
			if ok {
				r.t.post.takeClaim()
			}
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
	if segs > len(t.segIdx) || tx.creditsFree()+t.claim-t.pending < segs {
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

// 6. Post.

// poster posts host frames for one goroutine and owns that goroutine's
// part of the busy-poll duty. The host reader busy-polls the TX CQ (its
// poster has reaps set): while it does, the CQ stays unarmed, and the
// reader hands re-arming back before it blocks. Every other poster (the
// REP handler posting parked frames, the control loop's ARP re-probe)
// hands re-arming back to the TX poller after each post, because the
// reader may be blocked with the CQ unarmed and nothing else would reap
// what it posted. EndBusyPoll never blocks.
type poster struct {
	tx    *txPath
	reaps bool
	// claim is the batch's claim (txScratch.claim) of a reader that
	// shares the credits; nil for every other poster.
	claim *int
	wr    [1]hca.SendWR
}

// takeClaim moves the credit just taken (outstanding) out of the batch's
// claim, if it has one left: after the add to outstanding, so the two
// never count less than was taken and no other reader claims the credit
// in between.
func (p *poster) takeClaim() {
	if c := p.claim; c != nil && *c > 0 {
		*c--
		p.tx.claimed.Add(-1)
	}
}

// sendDest is where a send goes: an established connection (tc), whose
// send slot the caller reserved (tc.outstanding) under the neighbour
// table's lock, or a UD destination (address handle and QPN).
type sendDest struct {
	tc  *txConn
	ah  hca.AH
	qpn hca.QPN
}

// post sends pool buffer bufIdx, a host frame of size bytes with its
// Ethernet header, to d, taking one global credit for it. The Ethernet
// header's tail becomes the IPoIB header in place. It reports whether the
// buffer is now the send's; otherwise the failure was counted (and a
// connection that refused the send is torn down).
//
// o asks for offloads: SendIPCsum, or a UD LSO (o.mss) that the HCA cuts
// into o.segs packets. Such a WR takes one credit and one send slot like
// any other; tx_packets and tx_bytes count it once, as Linux counts one
// GSO skb (the offload counters count its packets).
func (p *poster) post(d sendDest, bufIdx, size int, etherType uint16, o sendOffload) bool {
	tx := p.tx
	b := tx.pool.bufs[bufIdx]
	frame.PutEncap(b[headroom:], etherType)
	tx.pool.lens[bufIdx] = size - headroom
	qp := tx.ud
	if d.tc != nil {
		qp = d.tc.qp
		p.wr[0] = hca.SendWR{ID: wrID(wrKindSend, bufIdx), Data: b[headroom:size], Flags: o.flags}
	} else {
		p.wr[0] = hca.SendWR{ID: wrID(wrKindSend, bufIdx), Data: b[headroom:size], Flags: o.flags, MSS: o.mss, AH: d.ah, RemoteQPN: d.qpn, RemoteQKey: frame.QKeyIPoIB}
	}
	tx.outstanding.Add(1)
	p.takeClaim()
	n, err := qp.PostSend(p.wr[:])
	if !p.reaps {
		tx.napi.EndBusyPoll()
	}
	if err != nil || n != 1 {
		tx.outstanding.Add(-1)
		tx.data.txErrors.Add(1)
		if errors.Is(err, hca.ErrLSOTooLarge) {
			tx.data.drop(dropTxLSOTooLarge)
		} else {
			tx.data.drop(dropTxPostFailed)
		}
		if d.tc != nil {
			// The reservation goes back as a completion would: a
			// teardown that ran meanwhile left the destroy to it.
			d.tc.sendDone()
			d.tc.sendFailed()
		}
		return false
	}
	if d.tc != nil {
		d.tc.packets.Add(1)
		d.tc.byts.Add(uint64(size - headroom))
	}
	if o.mss > 0 {
		tx.offCtr.txLSOWRs.Add(1)
		tx.offCtr.txLSOPackets.Add(uint64(o.segs))
	} else if o.flags&hca.SendIPCsum != 0 {
		tx.offCtr.txCsumHW.Add(1)
	}
	return true
}

// answerTooBig counts an IP packet too big for the path to n and builds
// the ICMP frag-needed / packet-too-big for the host into dst (nil: no
// room, counted all the same). It returns the reply, or nil.
func (tx *txPath) answerTooBig(dst []byte, n *neighbour, pkt []byte, mtu int) []byte {
	tx.data.txErrors.Add(1)
	tx.data.drop(dropTxTooBig)
	if dst == nil {
		return nil
	}
	m := frame.BuildTooBig(dst, tx.hostMAC(), n.mac, pkt, mtu)
	if m == 0 {
		return nil
	}
	tx.ctr.tooBigSent.Add(1)
	return dst[:m]
}

// 7. Send completion.

// handleTX is the TX poller's Handle (and the host reader's, when it
// busy-polls): send completions of the UD QP and of every active
// connection give back their pool buffer and their credit. A send error
// other than a flush tears the connection down; the next frame reconnects
// (Linux ipoib_cm_handle_tx_wc).
func (tx *txPath) handleTX(wcs []hca.WC) {
	credits := 0
	free := tx.free[:0]
	for k := range wcs {
		wc := &wcs[k]
		if wrKind(wc.ID) != wrKindSend {
			continue
		}
		idx := wrIndex(wc.ID)
		if idx >= len(tx.pool.bufs) {
			continue
		}
		free = append(free, idx)
		ok := wc.Status == hca.StatusSuccess
		if ok {
			tx.data.txPackets.Add(1)
			tx.data.txBytes.Add(uint64(tx.pool.lens[idx]))
		} else if wc.Status != hca.StatusWRFlushErr {
			tx.data.txErrors.Add(1)
			tx.data.drop(dropTxSendError)
		}
		switch ctx := wc.Context.(type) {
		case *udQP:
			credits++
		case *txConn:
			if ctx.sendDone() {
				credits++
			}
			if !ok {
				if wc.Status == hca.StatusWRFlushErr {
					tx.data.drop(dropTxNeighFlushed)
				} else {
					ctx.sendFailed()
				}
			}
		default:
			credits++
		}
	}
	tx.pool.put(free...)
	tx.free = free[:0]
	tx.returnCredits(credits)
}
