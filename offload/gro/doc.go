// Package gro is receive-side TCP coalescing (generic receive offload) in
// software: it merges consecutive in-order TCP segments of one flow from a
// batch of frames into one super frame the host takes as a GSO packet
// (offload.Meta with GSO, GSOSize and a partial checksum), the way Linux's
// NAPI GRO does for a NIC and wireguard-go's tcpGRO does for a TUN.
// ipoibcm uses it toward the host in datagram mode, where every UD
// receive is one MTU-sized frame; a gVisor host may use it too.
//
// # Rules
//
// The merge rules are Linux's, function by function (tcp_gro_receive,
// tcp4_gro_receive / tcp6_gro_receive, inet_gro_receive, ipv6_gro_receive,
// inet_gro_flush, ipv6_gro_flush, skb_gro_receive, gro_list_prepare). A
// segment joins the open chain of its flow (same IP version, addresses
// and ports) only if all of these hold:
//
//   - the link header is byte-for-byte the head's (gro_list_prepare
//     compares the MAC header);
//   - IPv4: no options (Linux takes only version/IHL 0x45), not a fragment
//     and no reserved flag, a valid header checksum, the same TOS, TTL and
//     DF as the head, and an ID that is the head's plus the number of
//     segments already in the chain, or, when the second segment carries
//     the head's ID with DF set, the head's ID for every segment (an
//     atomic, fixed-ID flow: inet_gro_flush);
//   - IPv6: the same first word (version, traffic class, flow label) and
//     hop limit, TCP directly behind the fixed header;
//   - the IP length fields match the frame (no link padding) and the frame
//     is not already a GSO frame;
//   - TCP: the same 32-bit word of data offset, flags and window except
//     CWR, FIN and PSH; no CWR on the joining segment (CWR may be on the
//     head only, and Meta.ECN then says so); the same acknowledgement
//     number; the same option bytes, timestamps included (tcp_gro_receive
//     compares the whole option area, so a chain ends whenever TSval
//     changes); a payload of 1 to mss bytes, where mss is the head's
//     payload; a sequence number right after the chain's last byte;
//   - the chain stays within 65535 bytes of IP packet (skb_gro_receive's
//     64 KiB limit);
//   - its checksum is known good (below).
//
// A chain ends (is complete, and later segments start a new one) after a
// segment shorter than mss or one with PSH or FIN (both move to the super
// frame's header, as Linux ORs them into the head), or when a segment of
// the flow does not join. A segment with URG, PSH, RST, SYN or FIN, or
// without payload, never starts a chain: it passes through alone.
//
// # Checksums
//
// Linux validates a segment's checksum before it merges it
// (skb_gro_checksum_validate in tcp4_gro_receive): the coalescer does the
// same. A segment whose Meta says DataValid (the HCA verified it:
// IB_WC_IP_CSUM_OK) or NeedsCsum with the checksum at the TCP field
// (partial, CHECKSUM_PARTIAL, trusted as Linux trusts it) merges as it is;
// one in the zero state (CHECKSUM_NONE) is verified in software with
// offload.VerifyChecksums, and only when it is about to merge, so a lone
// segment is never checksummed here. A segment that fails passes through
// untouched, ends its flow's chain, and is left for the host to count and
// drop. A merged frame leaves with NeedsCsum: the TCP checksum field holds
// the pseudo-header sum for the new length (tcp4_gro_complete /
// tcp6_gro_complete), CsumStart the TCP header's offset in the frame,
// CsumOffset 16, and the IPv4 header checksum is recomputed.
//
// # Order
//
// Each output frame stands where its first segment stood in the input;
// the segments merged into it move up to it. A frame of a flow that does
// not join the flow's chain ends the chain first, so a TCP connection's
// segments leave in the order they came (unlike Linux, which keeps
// chains with differing flow labels or MAC headers side by side as
// separate flows, these end the chain here). Between flows the order may
// change the way Linux GRO changes it: a merged frame leaves before
// frames of other flows that arrived between its segments. Frames that
// are not TCP, or do not parse, pass through unchanged and in order; one
// that may still be a flow's (an IPv4 fragment or an IPv6 packet behind
// extension headers, between a chain's addresses) ends the chain, which
// a flush that keeps open chains (FlushOpen) would otherwise let it
// overtake.
//
// # State
//
// A Coalescer is one goroutine's (the poller's). Add keeps a reference to
// each frame until Flush has emitted it, so the caller keeps its buffers
// until then; frames Flush emits from the coalescer's own super-frame
// buffers stay valid until the next Add. State is bounded: at most
// Config.Flows chains are open at once (opening one more ends the oldest,
// as gro_flush_oldest does), and a batch builds at most Config.Buffers
// super frames of 64 KiB plus the link header each, allocated on first
// use and kept; a merge that finds none free does not happen. The frame
// table holds Config.Batch frames between flushes without allocating
// (more make it grow once). In steady state nothing is allocated.
//
// A batch may also go on past a flush (FlushOpen, FlushVecOpen), as Linux
// keeps its GRO lists across NAPI polls that used their whole budget:
// the chains still open stay, with the caller's frames they hold, which
// the flush names by the tag AddHeaders was given, and a flow's next
// segments join them after the flush as within one batch.
//
// # Gathering
//
// A writer that gathers (writev on a vnet TAP) need not have a super
// frame in one piece. With Config.Gather a chain copies only the head's
// headers (into a buffer of the coalescer's, where the length, flag and
// checksum fix-ups go) and keeps a reference to each segment's payload
// where Add found it; FlushVec emits each frame as its pieces in order:
// an unmerged frame as the one slice Add took, a super frame as the
// headers followed by the payloads. No payload byte is copied, which
// saves a 64 KiB copy per super frame on the receive path; the merge
// decisions, the bytes of the frames and their Meta are those of a
// copying coalescer (the property and fuzz tests compare the two), and
// Flush still works, copying the pieces together at the end. The
// payloads stay the caller's: its buffers must outlive the write, as
// they already must outlive Flush.
package gro
