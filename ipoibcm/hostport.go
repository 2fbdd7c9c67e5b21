package ipoibcm

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/offload"
)

// HostPort is the host side of an Interface: a device that moves whole
// Ethernet frames (no FCS) in batches. The kernel TAP (package tap) and the
// in-process gVisor host (package tap/netstack) implement it.
//
// The Interface calls ReadFrames from one goroutine and WriteFrames from
// another; an implementation must allow that concurrency.
type HostPort interface {
	// ReadFrames blocks until at least one frame is available, then fills
	// up to len(bufs) buffers, sets sizes[i] to each frame's length and
	// returns the number of frames. A frame longer than its buffer is
	// truncated to the buffer (the Interface drops it as oversize). After
	// Close it returns an error wrapping net.ErrClosed.
	ReadFrames(bufs [][]byte, sizes []int) (int, error)
	// WriteFrames hands frames to the host. The port must not retain the
	// slices after it returns. It returns how many were written.
	WriteFrames(frames [][]byte) (int, error)
	// BatchSize is the largest batch ReadFrames may fill.
	BatchSize() int
	// HostMAC is the host's own MAC address: the destination of every frame
	// the Interface writes.
	HostMAC() net.HardwareAddr
	// SetMTU tells the host the link's IP MTU changed (mode switch).
	SetMTU(mtu int) error
	// SetLinkUp reports carrier: up once the broadcast group is joined.
	SetLinkUp(up bool) error
	// Close unblocks ReadFrames and releases the device.
	Close() error
}

// OffloadPort is a HostPort whose frames carry offload metadata
// (offload.Meta): super frames the host left unsegmented (TSO/USO) and
// checksums it left partial, and, toward the host, coalesced (GRO) frames
// and checksums the HCA verified. The Interface uses it when the port
// implements it; a plain HostPort only moves complete MTU-sized frames.
//
// The kernel TAP with IFF_VNET_HDR (package tap) and the gVisor host
// (package tap/netstack) implement it.
type OffloadPort interface {
	HostPort
	// ReadFramesMeta is ReadFrames that also fills meta[i] for each frame.
	// Buffers must hold a super frame (64 KiB plus the link header) for
	// the port to pass GSO frames up whole.
	ReadFramesMeta(bufs [][]byte, sizes []int, meta []offload.Meta) (int, error)
	// WriteFramesMeta is WriteFrames with each frame's metadata; a frame
	// whose Meta the host does not accept (HostOffloads) is the caller's
	// bug and the port completes or segments it in software.
	WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error)
	// HostOffloads is what the host accepts from the Interface on write.
	HostOffloads() offload.Caps
	// SetOffloads sets what the Interface accepts from the host on read,
	// as ethtool -K / TUNSETOFFLOAD does, so the advertised features can
	// follow a mode switch. It returns what is actually in effect.
	SetOffloads(want offload.Caps) (offload.Caps, error)
}

// GatherPort is an OffloadPort that also writes frames given in pieces
// (writev): GRO's super frames then go to the host as their rebuilt
// headers followed by each segment's payload where it was received, with
// no copy into a 64 KiB buffer (gro.Config.Gather). The kernel TAP with
// IFF_VNET_HDR implements it.
type GatherPort interface {
	OffloadPort
	// WriteFramesGather is WriteFramesMeta for frames each made of its
	// pieces in order. The port must not retain the slices after it
	// returns.
	WriteFramesGather(frames [][][]byte, meta []offload.Meta) (int, error)
}

// MultiQueuePort is a GatherPort with several queues, as a TAP opened
// with IFF_MULTI_QUEUE (package tap, Config.Queues): the host spreads its
// flows over the queues, and each queue is read and written on its own.
// The Interface gives every queue a host reader of its own and writes
// each flow's frames to the queue its addresses and ports hash to
// (flowQueue, hostqueue.go), so queues never wait for each other. Queue 0
// is the port's own ReadFramesMeta and WriteFrames*; the port's other
// methods (SetMTU, SetLinkUp, SetOffloads, Close) stand for every queue.
//
// Each queue is read from a goroutine of its own, so ReadQueue runs for
// different queues at once; writes to one queue are serialised, writes to
// different queues are not.
type MultiQueuePort interface {
	GatherPort
	// NumQueues is how many queues the port has, at least 1; fixed.
	NumQueues() int
	// ReadQueue is ReadFramesMeta on queue q.
	ReadQueue(q int, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error)
	// WriteQueue is WriteFramesMeta on queue q; with meta nil it is
	// WriteFrames (complete frames).
	WriteQueue(q int, frames [][]byte, meta []offload.Meta) (int, error)
	// WriteQueueGather is WriteFramesGather on queue q.
	WriteQueueGather(q int, frames [][][]byte, meta []offload.Meta) (int, error)
}

// The write halves a hostWriter uses: a HostPort is a frameWriter, an
// OffloadPort a metaWriter, a GatherPort a gatherWriter, and one queue of
// a MultiQueuePort (portQueue, hostqueue.go) all three.
type (
	frameWriter interface {
		WriteFrames(frames [][]byte) (int, error)
	}
	metaWriter interface {
		WriteFramesMeta(frames [][]byte, meta []offload.Meta) (int, error)
	}
	gatherWriter interface {
		WriteFramesGather(frames [][][]byte, meta []offload.Meta) (int, error)
	}
)

// hostWriter is the end of the flow HCA → host for one host queue, and
// where the engine's own answers to the host (ICMP too-big from the TX
// side) go too: the RX poller, the host readers and the REP handler all
// write, so writes to one queue are serialised; another queue has its
// own writer and lock.
type hostWriter struct {
	mu     sync.Mutex
	host   frameWriter
	off    metaWriter   // when the host takes offload metadata; nil otherwise
	gather gatherWriter // when it also takes frames in pieces; nil otherwise
	// drops counts the frames the host did not take (rx_host_write);
	// a write error is expected unless the interface runs (life): it
	// is closing.
	drops *counters
	life  *ifStateCell
	log   *slog.Logger
	// frames and byts count what the host took through this queue
	// (rx-N.packets, rx-N.bytes).
	frames, byts atomic.Uint64
}

func (w *hostWriter) init(host frameWriter, off metaWriter, gather gatherWriter, drops *counters, life *ifStateCell, log *slog.Logger) {
	w.host, w.off, w.gather, w.drops, w.life, w.log = host, off, gather, drops, life, log
}

// writeMeta hands frames with their offload metadata to an OffloadPort
// (to a plain HostPort, rxMeta left every Meta zero).
func (w *hostWriter) writeMeta(frames [][]byte, meta []offload.Meta) {
	p := w.off
	if p == nil {
		w.write(frames)
		return
	}
	w.mu.Lock()
	n, err := p.WriteFramesMeta(frames, meta)
	w.mu.Unlock()
	w.account(len(frames), n, err)
	w.count(frames[:min(n, len(frames))])
}

// writeGather hands frames in pieces with their metadata to a GatherPort.
func (w *hostWriter) writeGather(frames [][][]byte, meta []offload.Meta) {
	w.mu.Lock()
	n, err := w.gather.WriteFramesGather(frames, meta)
	w.mu.Unlock()
	w.account(len(frames), n, err)
	n = min(n, len(frames))
	w.frames.Add(uint64(n))
	var b int
	for _, f := range frames[:n] {
		for _, p := range f {
			b += len(p)
		}
	}
	w.byts.Add(uint64(b))
}

// write hands frames to the host; the ones it does not take are counted
// rx_host_write.
func (w *hostWriter) write(frames [][]byte) {
	w.mu.Lock()
	n, err := w.host.WriteFrames(frames)
	w.mu.Unlock()
	w.account(len(frames), n, err)
	w.count(frames[:min(n, len(frames))])
}

// count adds frames the host took to the queue's counters.
func (w *hostWriter) count(frames [][]byte) {
	var b int
	for _, f := range frames {
		b += len(f)
	}
	w.frames.Add(uint64(len(frames)))
	w.byts.Add(uint64(b))
}

// account counts the frames of a write of total the host did not take.
func (w *hostWriter) account(total, n int, err error) {
	for range total - n {
		w.drops.drop(dropRxHostWrite)
	}
	if err != nil && w.life.running() {
		w.log.Debug("host write", "err", err)
	}
}
