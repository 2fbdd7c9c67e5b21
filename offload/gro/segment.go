package gro

import (
	"encoding/binary"

	"github.com/ipoibcm/ipoib/internal/packet"
	"github.com/ipoibcm/ipoib/offload"
)

// TCP flag bits (the byte at offset 13 of the TCP header).
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpURG = 0x20
	tcpCWR = 0x80
)

// ipv4DF is the don't-fragment bit of the IPv4 flags/fragment word.
const ipv4DF = 0x4000

// maxIPLen is the largest IP packet a chain may grow to (skb_gro_receive
// refuses to reach 64 KiB, GRO_LEGACY_MAX_SIZE).
const maxIPLen = 65535

// segClass is what GRO may do with an input frame.
type segClass uint8

const (
	// segOther: not TCP, or it does not parse. It passes through and
	// belongs to no flow; one that may still carry TCP ends the chains
	// between its addresses (Coalescer.endUnkeyed).
	segOther segClass = iota
	// segAlone: TCP of a known flow that GRO cannot take (a GSO frame,
	// IPv4 options, link padding, no payload, a checksum state it cannot
	// use): it passes through and ends its flow's chain, where Linux
	// flushes it up at once.
	segAlone
	// segCandidate: it may start or join a chain.
	segCandidate
)

// csumState is what is known of a segment's TCP (and IPv4 header)
// checksum.
type csumState uint8

const (
	// csumUnknown: CHECKSUM_NONE; verified in software before a merge.
	csumUnknown csumState = iota
	// csumGood: verified by the HCA, partial (never computed, as across a
	// veth), or verified here.
	csumGood
	// csumBad: verified here and wrong.
	csumBad
)

// flowKey is the identity of a TCP flow: what tcp_gro_lookup and the IP
// layers' same-flow tests compare (addresses, ports, version). The rest
// of what Linux compares decides whether a segment joins, not which flow
// it belongs to.
type flowKey struct {
	addrs [32]byte // source then destination, IPv4 in the first 4 bytes of each half
	ports uint32   // source and destination port
	v6    bool
}

// segment is one input frame as GRO sees it.
type segment struct {
	frame   []byte
	meta    offload.Meta
	class   segClass
	h       offload.Headers
	key     flowKey
	seq     uint32
	payload int
	flags   byte
	// final: the segment may end a chain but never starts one
	// (tcp_gro_receive's out_check_final: URG, PSH, RST, SYN, FIN).
	final bool
	csum  csumState
	tag   int32 // the caller's (AddHeaders)
}

// classify parses frame, whose IP header starts at l3off, into s.
func (s *segment) classify(frame []byte, meta offload.Meta, l3off int) {
	h, _, l4 := offload.ReadHeaders(frame, l3off)
	s.classifyRead(frame, meta, h, l4)
}

// classifyRead is classify of a frame already parsed: h and l4 are
// offload.ReadHeaders' reading of it (l4: a whole TCP or UDP packet).
func (s *segment) classifyRead(frame []byte, meta offload.Meta, h offload.Headers, l4 bool) {
	*s = segment{frame: frame, meta: meta}
	if !l4 || h.Proto != offload.ProtoTCP {
		return
	}
	s.class, s.h = segAlone, h
	ip, tcp := frame[h.L3:], frame[h.L4:]
	if h.IPv6 {
		copy(s.key.addrs[:], ip[8:40])
		s.key.v6 = true
	} else {
		copy(s.key.addrs[0:4], ip[12:16])
		copy(s.key.addrs[16:20], ip[16:20])
	}
	s.key.ports = binary.BigEndian.Uint32(tcp)
	s.seq = binary.BigEndian.Uint32(tcp[4:])
	s.flags = tcp[13]
	s.payload = h.Len - h.End
	if meta.GSO != offload.GSONone || h.Len != len(frame) || s.payload == 0 {
		return
	}
	if !h.IPv6 && (ip[0] != 0x45 || binary.BigEndian.Uint16(ip[6:])&^ipv4DF != 0 ||
		!packet.IPv4ChecksumValid(ip)) {
		return
	}
	switch {
	case meta.DataValid:
		s.csum = csumGood
	case meta.NeedsCsum:
		if int(meta.CsumStart) != h.L4 || meta.CsumOffset != 16 {
			return
		}
		s.csum = csumGood
	}
	s.final = s.flags&(tcpURG|tcpPSH|tcpRST|tcpSYN|tcpFIN) != 0
	s.class = segCandidate
}

// verify settles an unknown checksum in software.
func (s *segment) verify(l3off int, st *stats) csumState {
	if s.csum == csumUnknown {
		s.csum = verdict(offload.VerifyChecksums(s.frame, l3off), st)
	}
	return s.csum
}

// verdict counts one software verification.
func verdict(ok bool, st *stats) csumState {
	st.verified.Add(1)
	if ok {
		return csumGood
	}
	st.badCsum.Add(1)
	return csumBad
}
