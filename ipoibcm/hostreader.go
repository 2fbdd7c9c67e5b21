package ipoibcm

import (
	"errors"
	"net"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// txScratch is the host reader's reusable state.
type txScratch struct {
	idx   []int
	bufs  [][]byte
	sizes []int
	free  []int
	wr    [1]hca.SendWR
	nd    []byte // ND rewrite scratch

	// replies are frames for the host made while reading (ICMP too-big).
	replyBufs [][]byte
	replies   [][]byte
}

const replyBufSize = 1536 // an ICMPv6 packet-too-big quotes up to 1280 bytes

func (t *txScratch) init(batch int) {
	t.idx = make([]int, batch)
	t.bufs = make([][]byte, batch)
	t.sizes = make([]int, batch)
	t.free = make([]int, 0, batch)
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

// hostReader reads batches of Ethernet frames from the host, translates
// them and posts the sends. It holds Interface.mu once per batch, not per
// frame, and stops reading while TX credits are exhausted.
//
// It also reaps send completions itself after each batch (napi BusyPoll),
// as mlx4/mlx5 reap TX completions in the transmit path: on the soft
// fabric a send usually completes inside PostSend, so the TX poller's
// goroutine is never woken for it. While it busy-polls the TX CQ stays
// unarmed; the reader hands re-arming back (EndBusyPoll) whenever it may
// block with sends outstanding, so a completion is never left unnoticed.
func (i *Interface) hostReader() {
	defer i.readerWG.Done()
	defer i.txNAPI.EndBusyPoll() // the TX poller reaps whatever is left
	t := &txScratch{}
	t.init(max(1, i.host.BatchSize()))
	for {
		if !i.waitCredits() {
			return
		}
		want := min(len(t.idx), max(1, i.creditsFree()))
		n := i.pool.take(t.idx[:want])
		if n == 0 {
			if i.txNAPI.BusyPoll() > 0 {
				continue // completions gave buffers back
			}
			// Every buffer is in flight: wait for completions like for
			// credits, with the TX CQ armed.
			if !i.stopQueue(stopForBuffers) {
				return
			}
			continue
		}
		for k := range n {
			t.bufs[k] = i.pool.bufs[t.idx[k]]
		}
		if i.outstanding.Load() > 0 {
			// The read may block: completions still to come need the
			// completion event.
			i.txNAPI.EndBusyPoll()
		}
		got, err := i.host.ReadFrames(t.bufs[:n], t.sizes[:n])
		if err != nil {
			i.pool.put(t.idx[:n]...)
			select {
			case <-i.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			i.log.Warn("host read", "err", err)
			continue
		}
		got = min(got, n)
		now := time.Now()
		t.free = t.free[:0]
		t.replies = t.replies[:0]
		i.mu.Lock()
		for k := range got {
			if !i.txFrameLocked(t, t.idx[k], t.sizes[k], now) {
				t.free = append(t.free, t.idx[k])
			}
		}
		i.mu.Unlock()
		t.free = append(t.free, t.idx[got:n]...)
		i.pool.put(t.free...)
		if len(t.replies) > 0 {
			i.writeHost(t.replies)
		}
		if got > 0 {
			i.txNAPI.BusyPoll()
		}
	}
}

// writeHost hands frames to the host; the RX poller and the reader both
// write, so writes are serialised.
func (i *Interface) writeHost(frames [][]byte) {
	i.hostWriteMu.Lock()
	n, err := i.host.WriteFrames(frames)
	i.hostWriteMu.Unlock()
	for range len(frames) - n {
		i.ctr.drop(dropRxHostWrite)
	}
	if err != nil && ifState(i.state.Load()) == ifRunning {
		i.log.Debug("host write", "err", err)
	}
}

// txFrameLocked translates one host frame in pool buffer bufIdx and posts
// or parks it. It reports whether the buffer was consumed (posted or
// parked); otherwise the frame was dropped, counted, or answered locally.
func (i *Interface) txFrameLocked(t *txScratch, bufIdx, size int, now time.Time) bool {
	b := i.pool.bufs[bufIdx]
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
	switch h.EtherType {
	case frame.EtherTypeARP:
		return i.txARPLocked(t, bufIdx, h, payload, now)
	case frame.EtherTypeIPv4:
		if !validIPv4(payload) {
			i.ctr.drop(dropTxNotIP)
			return false
		}
		if g, ok := igmpReportGroups(payload, i.mcastScratch[:0]); ok {
			for _, a := range g {
				i.joinIPLocked(a)
			}
		}
	case frame.EtherTypeIPv6:
		if !validIPv6(payload) {
			i.ctr.drop(dropTxNotIP)
			return false
		}
		if g, ok := mldReportGroups(payload, i.mcastScratch[:0]); ok {
			for _, a := range g {
				i.joinIPLocked(a)
			}
		}
		if frame.IsND(payload) {
			n, ok := i.txNDLocked(t, payload)
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
		return i.txMulticastLocked(t, bufIdx, size, h.EtherType, i.mgidFor(h, payload))
	}
	n := i.neigh.lookupMAC(h.Dst)
	if n == nil {
		i.ctr.drop(dropTxUnknownNeighbour)
		return false
	}
	return i.txNeighLocked(t, n, bufIdx, size, h.EtherType, now)
}

// mgidFor maps a host multicast/broadcast frame to its group: IP multicast
// destinations to their MGID (from the IP address: the MAC lost bits),
// everything else (broadcast, ARP) to the broadcast group.
func (i *Interface) mgidFor(h frame.EthHeader, payload []byte) hca.GID {
	switch h.EtherType {
	case frame.EtherTypeIPv4:
		if dst := ipv4Dst(payload); dst.IsMulticast() {
			return frame.MulticastMGID(dst, i.cfg.PKey)
		}
	case frame.EtherTypeIPv6:
		if dst := ipv6Dst(payload); dst.IsMulticast() {
			return frame.MulticastMGID(dst, i.cfg.PKey)
		}
	}
	return i.bcast
}

// txNDLocked rewrites a host neighbour-discovery packet to IPoIB form (our
// hardware address in the link-layer options) in place, and joins the
// solicited-node group of the host address it reveals.
func (i *Interface) txNDLocked(t *txScratch, payload []byte) (int, bool) {
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
		i.noteHostIPLocked(src)
		i.joinIPLocked(solicitedNode(src))
	}
	copy(payload[:cap(payload)][:n], t.nd[:n])
	return n, true
}

func (i *Interface) txMulticastLocked(t *txScratch, bufIdx, size int, etherType uint16, mgid hca.GID) bool {
	if size-frame.EthHdrLen > i.udMTU {
		i.ctr.txErrors.Add(1)
		i.ctr.drop(dropTxTooBig)
		return false
	}
	ah, err := i.groupAHLocked(mgid)
	if err != nil {
		i.ctr.drop(dropTxNoAH)
		return false
	}
	return i.sendUDLocked(&t.wr, ah, hca.QPNMulticast, bufIdx, size, etherType)
}

// txNeighLocked sends a unicast frame to neighbour n: over its RC
// connection in connected mode when it has the 'C' flag (starting the
// connection and parking the frame if needed), else over UD.
func (i *Interface) txNeighLocked(t *txScratch, n *neighbour, bufIdx, size int, etherType uint16, now time.Time) bool {
	n.lastUse = now
	ipLen := size - frame.EthHdrLen
	if i.useCMLocked(n, now) {
		tc := n.tx
		if tc == nil {
			tc = i.startTXLocked(n, now)
		}
		if tc != nil {
			switch tc.state {
			case txUp:
				if pathMTU := min(tc.mtu-frame.EncapLen, i.MTU()); ipLen > pathMTU {
					i.tooBigLocked(t, n, bufIdx, size, pathMTU)
					return false
				}
				return i.postRCLocked(t, tc, bufIdx, size, etherType)
			case txConnecting:
				return i.parkLocked(n, bufIdx, size)
			}
		}
	}
	if pathMTU := min(i.udMTU, i.MTU()); ipLen > pathMTU {
		i.tooBigLocked(t, n, bufIdx, size, pathMTU)
		return false
	}
	ah, err := i.neighAHLocked(n)
	if err != nil {
		i.ctr.drop(dropTxNoAH)
		return false
	}
	return i.sendUDLocked(&t.wr, ah, n.hw.QPN(), bufIdx, size, etherType)
}

func (i *Interface) useCMLocked(n *neighbour, now time.Time) bool {
	return i.cmm != nil && Mode(i.mode.Load()) == ModeConnected && n.hw.Connected() && !now.Before(n.cmBackoffUntil)
}

// parkLocked keeps a frame for a connection being set up (at most
// maxParked per neighbour). A parked frame holds a TX credit so the REP
// handler can post it without overrunning a send queue; all parked frames
// together hold at most parkedCreditCap credits. Linux does not count
// neigh->queue against tx_outstanding at all, but there a parked skb costs
// no send slot; here it holds a pool buffer, so the cap keeps a crowd of
// unresponsive 'C' peers (each parking 3 frames for a ~30 s CM timeout)
// from stopping the reader for everyone else.
func (i *Interface) parkLocked(n *neighbour, bufIdx, size int) bool {
	if n.nParked == maxParked || i.parkedCredits >= i.parkedCreditCap() {
		i.ctr.drop(dropTxNeighQueueFull)
		return false
	}
	n.parked[n.nParked] = parkedFrame{buf: bufIdx, n: size}
	n.nParked++
	i.parkedCredits++
	i.outstanding.Add(1)
	return true
}

// parkedCreditCap is a quarter of the send queue, but never less than
// one neighbour's worth.
func (i *Interface) parkedCreditCap() int {
	return max(maxParked, i.cfg.SendQueueSize/4)
}

// unparkLocked forgets n's parked frames once they were posted or
// dropped; their credits are returned by the caller or the completions.
func (i *Interface) unparkLocked(n *neighbour) {
	i.parkedCredits -= n.nParked
	n.nParked = 0
}

// dropParkedLocked drops n's parked frames, counted under reason.
func (i *Interface) dropParkedLocked(n *neighbour, reason dropReason) {
	for k := range n.nParked {
		i.pool.put1(n.parked[k].buf)
		i.ctr.drop(reason)
	}
	cnt := n.nParked
	i.unparkLocked(n)
	i.returnCredits(cnt)
}

// tooBigLocked drops an IP packet larger than the path and answers the
// host with ICMP frag-needed / ICMPv6 packet-too-big carrying mtu.
func (i *Interface) tooBigLocked(t *txScratch, n *neighbour, bufIdx, size, mtu int) {
	b := i.pool.bufs[bufIdx]
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
	i.rs.tooBigSent.Add(1)
	return dst[:m]
}

// postUDLocked posts pool buffer bufIdx as a UD send for any goroutine.
// The host reader may be blocked with the TX CQ unarmed (it busy-polls
// the CQ and had nothing outstanding), so the send hands TX re-arming back
// to the TX poller, which then reaps its completion. EndBusyPoll never
// blocks, so it is safe under Interface.mu.
func (i *Interface) postUDLocked(wr *[1]hca.SendWR, ah hca.AH, qpn hca.QPN, bufIdx, size int, etherType uint16) bool {
	ok := i.sendUDLocked(wr, ah, qpn, bufIdx, size, etherType)
	i.txNAPI.EndBusyPoll()
	return ok
}

// sendUDLocked posts pool buffer bufIdx (a host frame) as a UD send; the
// host reader's path, which reaps the completion itself.
func (i *Interface) sendUDLocked(wr *[1]hca.SendWR, ah hca.AH, qpn hca.QPN, bufIdx, size int, etherType uint16) bool {
	b := i.pool.bufs[bufIdx]
	frame.PutEncap(b[headroom:], etherType)
	i.pool.lens[bufIdx] = size - headroom
	wr[0] = hca.SendWR{ID: wrID(wrKindSend, bufIdx), Data: b[headroom:size], AH: ah, RemoteQPN: qpn, RemoteQKey: frame.QKeyIPoIB}
	i.outstanding.Add(1)
	if n, err := i.ud.qp.PostSend(wr[:]); err != nil || n != 1 {
		i.outstanding.Add(-1)
		i.ctr.txErrors.Add(1)
		i.ctr.drop(dropTxPostFailed)
		return false
	}
	return true
}

// postRCLocked posts pool buffer bufIdx on an established connection.
func (i *Interface) postRCLocked(t *txScratch, tc *txConn, bufIdx, size int, etherType uint16) bool {
	i.outstanding.Add(1)
	if !i.sendConnLocked(&t.wr, tc, bufIdx, size, etherType) {
		i.outstanding.Add(-1)
		return false
	}
	return true
}

// postConnLocked posts without touching the global credits (the caller
// already holds one), for goroutines other than the host reader (the REP
// handler posting parked frames): like postUDLocked it hands TX re-arming
// back to the TX poller.
func (i *Interface) postConnLocked(wr *[1]hca.SendWR, tc *txConn, bufIdx, size int, etherType uint16) bool {
	ok := i.sendConnLocked(wr, tc, bufIdx, size, etherType)
	i.txNAPI.EndBusyPoll()
	return ok
}

// sendConnLocked posts on an established connection; the host reader's
// path.
func (i *Interface) sendConnLocked(wr *[1]hca.SendWR, tc *txConn, bufIdx, size int, etherType uint16) bool {
	b := i.pool.bufs[bufIdx]
	frame.PutEncap(b[headroom:], etherType)
	i.pool.lens[bufIdx] = size - headroom
	wr[0] = hca.SendWR{ID: wrID(wrKindSend, bufIdx), Data: b[headroom:size]}
	tc.outstanding.Add(1)
	if n, err := tc.qp.PostSend(wr[:]); err != nil || n != 1 {
		tc.outstanding.Add(-1)
		i.ctr.txErrors.Add(1)
		i.ctr.drop(dropTxPostFailed)
		i.txConnFailed(tc)
		return false
	}
	tc.packets.Add(1)
	tc.byts.Add(uint64(size - headroom))
	return true
}
