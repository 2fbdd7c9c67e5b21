package ipoibcm

import (
	"encoding/binary"
	"log/slog"
	"math/bits"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/internal/packet"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// This file is the host port's queues: one for a plain HostPort,
// OffloadPort or GatherPort, NumQueues for a MultiQueuePort. Each queue
// has its own host reader (txpath.go) with its own stop and wake
// (readerGate) and batch (sendWindow), and its own hostWriter; frames
// toward the host go to the queue their flow hashes to (flowQueue).

// portQueue is queue k of a MultiQueuePort, seen as a port of its own:
// what a host reader reads and a hostWriter writes.
type portQueue struct {
	p MultiQueuePort
	k int
}

func (q portQueue) ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	return q.p.ReadQueue(q.k, bufs, sizes, meta)
}

func (q portQueue) WriteFrames(frames [][]byte) (int, error) {
	return q.p.WriteQueue(q.k, frames, nil)
}

func (q portQueue) WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error) {
	return q.p.WriteQueue(q.k, frames, meta)
}

func (q portQueue) WriteFramesGather(frames [][][]byte, meta []offload.Meta) (int, error) {
	return q.p.WriteQueueGather(q.k, frames, meta)
}

// metaReader is the read half of an OffloadPort or of a portQueue.
type metaReader interface {
	ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error)
}

// hostQueue is what the engine keeps for one queue of the host port: how
// it is read (nil: a plain HostPort's ReadFrames), its reader's stop and
// wake and batch window, its writer, and what its reader read (tx-N).
type hostQueue struct {
	read   metaReader
	gate   readerGate
	window sendWindow
	out    hostWriter
	// frames and byts count what the reader read from the host on this
	// queue (tx-N.packets, tx-N.bytes).
	frames, byts atomic.Uint64
}

// countRead adds a batch the reader read.
func (q *hostQueue) countRead(sizes []int) {
	var b int
	for _, n := range sizes {
		b += n
	}
	q.frames.Add(uint64(len(sizes)))
	q.byts.Add(uint64(b))
}

// stats is the queue's counters now.
func (q *hostQueue) stats() QueueStats {
	return QueueStats{
		TxPackets: q.frames.Load(), TxBytes: q.byts.Load(),
		RxPackets: q.out.frames.Load(), RxBytes: q.out.byts.Load(),
	}
}

// newHostQueues gives every queue of host its reader, writer, gate and
// window: one queue unless host is a MultiQueuePort with more.
func newHostQueues(host HostPort, off OffloadPort, drops *counters, life *ifStateCell, log *slog.Logger) []*hostQueue {
	mq, _ := host.(MultiQueuePort)
	n := 1
	if mq != nil {
		n = max(1, mq.NumQueues())
	}
	qs := make([]*hostQueue, n)
	for k := range qs {
		q := &hostQueue{}
		q.gate.init()
		q.window.init(log)
		switch {
		case n > 1:
			pq := portQueue{p: mq, k: k}
			q.read = pq
			q.out.init(pq, pq, pq, drops, life, log)
		case off != nil:
			q.read = off
			g, _ := off.(GatherPort)
			var gw gatherWriter
			if g != nil {
				gw = g
			}
			q.out.init(host, off, gw, drops, life, log)
		default:
			q.out.init(host, nil, nil, drops, life, log)
		}
		qs[k] = q
	}
	return qs
}

// hostWriters are the queues' writers, for whoever writes to the host
// without a queue of its own (the REP handler's ICMP answers).
type hostWriters []*hostWriter

// writeReplies writes frames (the engine's own answers, rare) to the
// queue the first one's flow hashes to.
func (ws hostWriters) writeReplies(frames [][]byte) {
	if len(frames) == 0 {
		return
	}
	ws[flowQueue(frames[0], len(ws))].write(frames)
}

// hostSplit is the RX path's host write: a batch goes to the host in one
// write per queue, each frame to the queue its flow hashes to. With one
// queue the batch goes through as it is. Used by the RX poller only (its
// scratch is the poller's).
type hostSplit struct {
	ws     hostWriters
	frames [][][]byte
	meta   [][]offload.Meta
	vec    [][][][]byte
}

func newHostSplit(ws hostWriters) *hostSplit {
	s := &hostSplit{ws: ws}
	if len(ws) > 1 {
		s.frames = make([][][]byte, len(ws))
		s.meta = make([][]offload.Meta, len(ws))
		s.vec = make([][][][]byte, len(ws))
	}
	return s
}

// writeMeta writes whole frames with their metadata.
func (s *hostSplit) writeMeta(frames [][]byte, meta []offload.Meta) {
	if len(s.ws) == 1 {
		s.ws[0].writeMeta(frames, meta)
		return
	}
	writeSplit(s.ws, frames, meta, s.frames, s.meta, wholeHead, (*hostWriter).writeMeta)
}

// writeGather writes frames in pieces, the first piece holding the
// headers the flow hash reads.
func (s *hostSplit) writeGather(frames [][][]byte, meta []offload.Meta) {
	if len(s.ws) == 1 {
		s.ws[0].writeGather(frames, meta)
		return
	}
	writeSplit(s.ws, frames, meta, s.vec, s.meta, piecesHead, (*hostWriter).writeGather)
}

// writeSplit sorts frames into parts by the queue their flow hashes to,
// keeping each queue's in order, writes each queue's part with one call
// of write and empties the parts again.
func writeSplit[F any](ws hostWriters, frames []F, meta []offload.Meta, parts [][]F, pm [][]offload.Meta,
	head func(F) []byte, write func(*hostWriter, []F, []offload.Meta)) {
	for k, f := range frames {
		q := flowQueue(head(f), len(ws))
		parts[q] = append(parts[q], f)
		pm[q] = append(pm[q], meta[k])
	}
	for q, w := range ws {
		if len(parts[q]) == 0 {
			continue
		}
		write(w, parts[q], pm[q])
		clear(parts[q])
		parts[q], pm[q] = parts[q][:0], pm[q][:0]
	}
}

// wholeHead and piecesHead are where a frame's headers are.
func wholeHead(f []byte) []byte { return f }

func piecesHead(f [][]byte) []byte {
	if len(f) == 0 {
		return nil
	}
	return f[0]
}

// flowQueue is the queue of n an Ethernet frame's flow goes to: a hash of
// its IP addresses and, unless it is a fragment, its TCP or UDP ports, so
// every frame of a flow takes one queue, in order, and the kernel's tun
// flow table (automq) sends the flow's frames the other way on the same
// queue. The addresses and the ports enter by XOR, so both directions of
// a flow hash alike. Frames that are not IP (ARP) take queue 0. The IP
// header is read through internal/packet (docs/decisions.md, "One packet
// layer"); the frame may end after its headers (a gathered frame's first
// piece).
func flowQueue(f []byte, n int) int {
	if n <= 1 || len(f) < frame.EthHdrLen {
		return 0
	}
	p := f[frame.EthHdrLen:]
	ip, err := packet.ParseIPHeader(p)
	if err != nil {
		return 0
	}
	var h uint64
	if ip.IPv6 {
		v6 := header.IPv6(p)
		s, d := v6.SourceAddressSlice(), v6.DestinationAddressSlice()
		h = binary.BigEndian.Uint64(s[:8]) ^ binary.BigEndian.Uint64(s[8:]) ^
			binary.BigEndian.Uint64(d[:8]) ^ binary.BigEndian.Uint64(d[8:])
	} else {
		v4 := header.IPv4(p)
		h = uint64(binary.BigEndian.Uint32(v4.SourceAddressSlice()) ^ binary.BigEndian.Uint32(v4.DestinationAddressSlice()))
	}
	// A fragment has no ports in every piece: all of a datagram's are
	// hashed by the addresses alone. IPv6 extension headers are not
	// walked, so such a packet is hashed by its addresses too.
	if l4 := p[ip.HeaderLen:]; !ip.Fragment && len(l4) >= 4 && (ip.Protocol == packet.ProtoTCP || ip.Protocol == packet.ProtoUDP) {
		h ^= uint64(binary.BigEndian.Uint16(l4[0:2])^binary.BigEndian.Uint16(l4[2:4])) << 32
	}
	h ^= uint64(ip.Protocol)
	// Fibonacci hashing mixes every input bit into the top ones; the
	// multiply-high maps them onto 0..n-1 without a division.
	hi, _ := bits.Mul64(h*0x9e3779b97f4a7c15, uint64(n))
	return int(hi)
}
