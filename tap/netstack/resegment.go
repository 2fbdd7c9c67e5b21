package netstack

import (
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ipoibcm/ipoib/offload"
)

// segmenter cuts one TCP segment larger than the reader takes into
// segments of at most mss payload bytes, as Linux's software GSO does for
// a device without TSO (offload.Headers.SegmentInto does the cutting).
// Two kinds of segment need it:
//
//   - super frames from gVisor's host GSO (Config.GSO) when the reader
//     does not accept TSO: a plain ReadFrames, or ReadFramesMeta before
//     SetOffloads turned TSO on;
//   - a segment the stack queued while the link MTU was larger.
//
// Why the second is cut rather than left to the engine's ICMP frag-needed:
// when the MTU shrinks under a running transfer (an IPoIB mode switch,
// 65520 -> 4092) the frames already queued make up the tail of the
// sender's flight. Dropping them loses that whole tail, and gVisor's TCP,
// unlike Linux's tcp_simple_retransmit, recovers from a lost tail after a
// PMTU decrease at two segments per retransmission timeout: after the RTO,
// RACK marks the old flight lost and enters SACK recovery, but the RFC 6675
// pipe (counted in the new, 16 times smaller MSS, and blind to RACK's
// marks) stays above the congestion window, so nothing is sent until the
// next RTO. Cutting the queued frames loses nothing, so there is nothing to
// recover.
//
// Only what offload.Parse takes is cut: IPv4 without fragmentation, IPv6
// with TCP as the first next header. Anything else too big goes out whole,
// for the engine to answer with ICMP.
type segmenter struct {
	frame []byte // the whole segment being cut, link header included
	h     offload.Headers
	mss   int
	next  int // index of the next cut
	n     int // cuts in all; next == n when nothing is pending
	// partial leaves each cut's TCP checksum as the pseudo-header sum, for
	// a reader that accepts partial checksums (offload.Caps.Csum).
	partial bool
}

func newSegmenter() segmenter {
	return segmenter{frame: make([]byte, maxFrameSize)}
}

// pending reports whether a segment is partly cut.
func (s *segmenter) pending() bool { return s.next < s.n }

// load takes the serialised frame in s.frame[:size] and prepares to cut it
// at mss payload bytes. It reports false, leaving nothing pending, when the
// frame is not a TCP segment it can cut or already fits.
func (s *segmenter) load(size, mss int, partial bool) bool {
	s.next, s.n = 0, 0
	if mss <= 0 {
		return false
	}
	h, err := offload.Parse(s.frame[:size], ethernetHeaderLen)
	if err != nil || h.Proto != offload.ProtoTCP || h.Len != size || h.Len-h.End <= mss {
		return false
	}
	s.h, s.mss, s.n, s.partial = h, mss, h.Segments(mss), partial
	return true
}

// cut writes the next segment into dst and returns its length and
// metadata, or 0 if dst is too small for it (the caller gives a buffer of
// at least the MTU plus the link header).
func (s *segmenter) cut(dst []byte) (int, offload.Meta) {
	n, err := s.h.SegmentInto(dst, s.frame, s.mss, s.next, !s.partial)
	if err != nil {
		return 0, offload.Meta{}
	}
	s.next++
	if !s.partial {
		return n, offload.Meta{}
	}
	return n, offload.Meta{NeedsCsum: true, CsumStart: uint16(s.h.L4), CsumOffset: uint16(s.h.CsumOffset())}
}

// drop abandons the segment being cut.
func (s *segmenter) drop() { s.next, s.n = 0, 0 }

// txPlan is what the link does with one packet the stack sent, given the
// link MTU and what the reader accepts: hand it out whole with meta, or
// cut it at mss (cut).
type txPlan struct {
	meta offload.Meta
	cut  bool
	mss  int
}

// planTX decides how pkt leaves. A TCP segment built by host GSO carries a
// partial checksum (gVisor's CHECKSUM_PARTIAL); one whose payload exceeds
// what fits the MTU (or gVisor's MSS, the smaller) is a super frame. The
// reader takes it as it is when accept covers it; otherwise the partial
// checksum is completed (whole) or the super frame cut (cut), as Linux's
// validate_xmit_skb does for a device without the feature.
func planTX(pkt *stack.PacketBuffer, ipMTU int, accept offload.Caps) txPlan {
	var p txPlan
	gso := pkt.GSOOptions
	hostGSO := gso.Type == stack.GSOTCPv4 || gso.Type == stack.GSOTCPv6
	if hostGSO && gso.NeedsCsum {
		p.meta.NeedsCsum = true
		p.meta.CsumStart = uint16(ethernetHeaderLen + len(pkt.NetworkHeader().Slice()))
		p.meta.CsumOffset = gso.CsumOffset
	}
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber || pkt.Size()-ethernetHeaderLen <= ipMTU && !hostGSO {
		return p
	}
	payload := pkt.Data().Size()
	p.mss = ipMTU - (pkt.Size() - payload - ethernetHeaderLen)
	if hostGSO && int(gso.MSS) < p.mss {
		p.mss = int(gso.MSS)
	}
	if payload <= p.mss {
		return p
	}
	if hostGSO {
		p.meta.GSO, p.meta.GSOSize = offload.GSOTCPv4, uint16(p.mss)
		if gso.Type == stack.GSOTCPv6 {
			p.meta.GSO = offload.GSOTCPv6
		}
		if tcp := pkt.TransportHeader().Slice(); len(tcp) >= header.TCPMinimumSize {
			p.meta.ECN = header.TCP(tcp).Flags()&header.TCPFlagCwr != 0
		}
		if accept.Accepts(p.meta) {
			return p
		}
	}
	// A segment queued before the MTU shrank has a complete checksum over
	// the whole of it, not a partial one, so it is never passed on as a
	// super frame: the reader's segmenter would take the checksum field
	// for a pseudo-header sum.
	p.cut, p.meta = true, offload.Meta{}
	return p
}
