package ipoibcm

import (
	"encoding/binary"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// mqPort is an in-memory MultiQueuePort: each queue is a gatherPort of its
// own (its in and out channels), queue 0 doubling as the port.
type mqPort struct {
	*gatherPort
	qs []*gatherPort
}

var _ MultiQueuePort = (*mqPort)(nil)

func newMQPort(mac byte, n int) *mqPort {
	p := &mqPort{}
	for range n {
		g := &gatherPort{metaPort: newMetaPort(mac, allCaps)}
		p.qs = append(p.qs, g)
	}
	p.gatherPort = p.qs[0]
	return p
}

func (p *mqPort) NumQueues() int { return len(p.qs) }

func (p *mqPort) ReadQueue(q int, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	return p.qs[q].ReadFramesMeta(bufs, sizes, meta)
}

func (p *mqPort) WriteQueue(q int, frames [][]byte, meta []offload.Meta) (int, error) {
	if meta == nil {
		return p.qs[q].WriteFrames(frames)
	}
	return p.qs[q].WriteFramesMeta(frames, meta)
}

func (p *mqPort) WriteQueueGather(q int, frames [][][]byte, meta []offload.Meta) (int, error) {
	return p.qs[q].WriteFramesGather(frames, meta)
}

func (p *mqPort) Close() error {
	for _, q := range p.qs {
		q.Close()
	}
	return nil
}

// udpFlowFrame is a UDP datagram from a's host to b's, of flow sport.
func udpFlowFrame(dst frame.MAC, src net.HardwareAddr, sport uint16, seq byte) []byte {
	b := make([]byte, frame.EthHdrLen+28+8)
	frame.PutEthernet(b, frame.EthHeader{Dst: dst, Src: frame.MAC(src), EtherType: frame.EtherTypeIPv4})
	ip := b[frame.EthHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], 36)
	ip[8], ip[9] = 64, 17
	copy(ip[12:16], []byte{10, 77, 0, 1})
	copy(ip[16:20], []byte{10, 77, 0, 2})
	binary.BigEndian.PutUint16(ip[10:12], ^ipSum(ip[:20]))
	binary.BigEndian.PutUint16(ip[20:22], sport)
	binary.BigEndian.PutUint16(ip[22:24], 5201)
	binary.BigEndian.PutUint16(ip[24:26], 16)
	ip[28] = seq
	return b
}

func ipSum(h []byte) uint16 {
	var s uint32
	for k := 0; k < len(h); k += 2 {
		s += uint32(binary.BigEndian.Uint16(h[k:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// hostReaders counts the goroutines running hostReader.run.
func hostReaders() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "(*hostReader).run")
}

// TestMultiQueueFlows: behind a MultiQueuePort the Interface reads every
// queue, writes every frame of a flow to the one queue the flow hashes to
// (so more than one queue carries the flows, in order), counts each
// queue's frames, and on Close stops every reader it started.
func TestMultiQueueFlows(t *testing.T) {
	const queues, flows, perFlow = 4, 32, 4
	base := runtime.NumGoroutine()
	readersBefore := hostReaders()
	pa, pb := newMQPort(1, queues), newMQPort(2, queues)
	p := newPortPair(t, ModeConnected, soft.Config{}, pa, pb)
	for start := time.Now(); hostReaders()-readersBefore != 2*queues; time.Sleep(time.Millisecond) {
		// Polling: a goroutine's start and exit are observable no other way.
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d host readers run for two interfaces of %d queues, want %d", hostReaders()-readersBefore, queues, 2*queues)
		}
	}
	warmUp(t, pa, pb, p.dstMAC)
	for seq := range perFlow {
		for f := range flows {
			// The host keeps a flow on one queue, not necessarily the one
			// the engine's hash gives.
			pa.qs[f%queues].in <- metaFrame{b: udpFlowFrame(p.dstMAC, pa.HostMAC(), uint16(10000+f), byte(seq))}
		}
	}
	queueOf := make(map[uint16]int)
	nextSeq := make(map[uint16]byte)
	used := make(map[int]bool)
	deadline := time.After(10 * time.Second)
	for got := 0; got < flows*perFlow; {
		var mf metaFrame
		var q int
		select {
		case mf = <-pb.qs[0].out:
		case mf = <-pb.qs[1].out:
			q = 1
		case mf = <-pb.qs[2].out:
			q = 2
		case mf = <-pb.qs[3].out:
			q = 3
		case <-deadline:
			t.Fatalf("%d of %d frames arrived", got, flows*perFlow)
		}
		if len(mf.b) < frame.EthHdrLen+28 || binary.BigEndian.Uint16(mf.b[12:14]) != frame.EtherTypeIPv4 {
			continue // ARP and the like
		}
		ip := mf.b[frame.EthHdrLen:]
		sport := binary.BigEndian.Uint16(ip[20:22])
		if prev, ok := queueOf[sport]; ok && prev != q {
			t.Fatalf("flow %d on queue %d and queue %d", sport, prev, q)
		}
		if want := flowQueue(mf.b, queues); q != want {
			t.Errorf("flow %d written to queue %d, its hash gives %d", sport, q, want)
		}
		if ip[28] != nextSeq[sport] {
			t.Errorf("flow %d: datagram %d arrived where %d was due", sport, ip[28], nextSeq[sport])
		}
		nextSeq[sport] = ip[28] + 1
		queueOf[sport], used[q] = q, true
		got++
	}
	if len(used) < 2 {
		t.Errorf("%d flows all took one queue", flows)
	}
	sa, sb := p.a.Stats(), p.b.Stats()
	if len(sa.Queues) != queues || len(sb.Queues) != queues {
		t.Fatalf("Stats has %d and %d queues, want %d", len(sa.Queues), len(sb.Queues), queues)
	}
	var read, written uint64
	for k := range queues {
		if sa.Queues[k].TxPackets == 0 {
			t.Errorf("a's queue %d read nothing: %+v", k, sa.Queues)
		}
		read += sa.Queues[k].TxPackets
		written += sb.Queues[k].RxPackets
		if used[k] != (sb.Queues[k].RxPackets > 0) {
			t.Errorf("b's queue %d: %d written, frames seen on it: %t", k, sb.Queues[k].RxPackets, used[k])
		}
	}
	if read < flows*perFlow || written < flows*perFlow {
		t.Errorf("queues read %d and wrote %d frames, want at least %d", read, written, flows*perFlow)
	}
	p.close()
	// A reader marks itself done just before its goroutine returns, so
	// its exit is watched as checkGoroutines watches every goroutine's.
	for start := time.Now(); hostReaders() != readersBefore; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d host readers still run 5 s after Close", hostReaders()-readersBefore)
		}
	}
	checkGoroutines(t, base)
}

// warmUp sends datagrams of one flow until one arrives, so the connection
// is up (frames park while it comes up, and only a few), and drains b.
func warmUp(t *testing.T, pa, pb *mqPort, dst frame.MAC) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pa.qs[0].in <- metaFrame{b: udpFlowFrame(dst, pa.HostMAC(), 9999, 0)}
		time.Sleep(20 * time.Millisecond)
		arrived := false
		for _, q := range pb.qs {
			for len(q.out) > 0 {
				<-q.out
				arrived = true
			}
		}
		if arrived {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no warm-up datagram arrived")
		}
	}
}

// TestFlowQueueSticky: the hash reads addresses and ports only, so every
// frame of a flow, whatever its length, payload or direction, takes one
// queue; a fragment and a frame that is not IP take theirs by the
// addresses, and one queue is always queue 0.
func TestFlowQueueSticky(t *testing.T) {
	src := net.HardwareAddr{2, 0, 0, 0, 0xee, 1}
	spread := make(map[int]bool)
	for f := range 64 {
		a := udpFlowFrame(frame.MAC{2, 9, 9, 9, 9, 9}, src, uint16(20000+f), 0)
		b := udpFlowFrame(frame.MAC{2, 9, 9, 9, 9, 9}, src, uint16(20000+f), 7)
		b = append(b, make([]byte, 100)...)
		q := flowQueue(a, 8)
		if flowQueue(b, 8) != q {
			t.Fatalf("flow %d: two frames hash to queues %d and %d", f, q, flowQueue(b, 8))
		}
		// The reply: addresses and ports swapped.
		r := append([]byte(nil), a...)
		ip := r[frame.EthHdrLen:]
		copy(ip[12:16], a[frame.EthHdrLen+16:frame.EthHdrLen+20])
		copy(ip[16:20], a[frame.EthHdrLen+12:frame.EthHdrLen+16])
		copy(ip[20:22], a[frame.EthHdrLen+22:frame.EthHdrLen+24])
		copy(ip[22:24], a[frame.EthHdrLen+20:frame.EthHdrLen+22])
		if flowQueue(r, 8) != q {
			t.Fatalf("flow %d: its reply hashes to queue %d, the flow to %d", f, flowQueue(r, 8), q)
		}
		if flowQueue(a, 1) != 0 {
			t.Fatal("one queue: not queue 0")
		}
		spread[q] = true
	}
	if len(spread) < 6 {
		t.Errorf("64 flows took %d of 8 queues", len(spread))
	}
	// cmd/ipoib's TestBinaryMultiQueueIperf counts on its four streams
	// (10.77.95.1 ports 40000..40003 to 10.77.95.2:5201) taking both of
	// two queues.
	iperf := make(map[int]bool)
	for port := uint16(40000); port < 40004; port++ {
		f := udpFlowFrame(frame.MAC{}, src, port, 0)
		ip := f[frame.EthHdrLen:]
		ip[9] = 6 // TCP
		copy(ip[12:16], []byte{10, 77, 95, 1})
		copy(ip[16:20], []byte{10, 77, 95, 2})
		iperf[flowQueue(f, 2)] = true
	}
	if len(iperf) != 2 {
		t.Error("the iperf3 streams of TestBinaryMultiQueueIperf all hash to one of two queues")
	}
	arp := make([]byte, 60)
	binary.BigEndian.PutUint16(arp[12:14], frame.EtherTypeARP)
	if flowQueue(arp, 8) != 0 {
		t.Error("ARP not on queue 0")
	}
	frag := udpFlowFrame(frame.MAC{}, src, 1, 0)
	binary.BigEndian.PutUint16(frag[frame.EthHdrLen+6:], 0x2000) // more fragments
	other := udpFlowFrame(frame.MAC{}, src, 2, 0)
	binary.BigEndian.PutUint16(other[frame.EthHdrLen+6:], 0x0010) // a later fragment
	if flowQueue(frag, 8) != flowQueue(other, 8) {
		t.Error("two fragments of one address pair hash apart")
	}
}

// countedAH is an address handle that counts its destroys.
type countedAH struct{ destroyed atomic.Int32 }

func (a *countedAH) DGID() hca.GID  { return hca.GID{} }
func (a *countedAH) Destroy() error { a.destroyed.Add(1); return nil }

// TestSendWindowsRetire: an address handle retired while readers' batches
// are open outlives every one of them and is destroyed once, by the last
// to end; with none open it goes at once; quiesce waits for every
// reader's batch.
func TestSendWindowsRetire(t *testing.T) {
	var w0, w1, w2 sendWindow
	for _, w := range []*sendWindow{&w0, &w1, &w2} {
		w.init(nil)
	}
	s := sendWindows{ws: []*sendWindow{&w0, &w1, &w2}}
	idle := &countedAH{}
	s.retire(idle)
	if idle.destroyed.Load() != 1 {
		t.Fatal("retired with no batch open, not destroyed at once")
	}
	ah := &countedAH{}
	w0.enter()
	w2.enter()
	s.retire(ah)
	w1.enter() // opened after: cannot have resolved ah
	w1.leave()
	w0.leave()
	if ah.destroyed.Load() != 0 {
		t.Fatal("destroyed while reader 2's batch, open at the retire, still runs")
	}
	done := make(chan struct{})
	go func() { s.quiesce(); close(done) }()
	select {
	case <-done:
		t.Fatal("quiesce returned while reader 2's batch is open")
	case <-time.After(20 * time.Millisecond):
	}
	w2.leave()
	<-done
	if n := ah.destroyed.Load(); n != 1 {
		t.Fatalf("destroyed %d times after the last batch ended, want once", n)
	}
	s.close()
	if n := ah.destroyed.Load(); n != 1 {
		t.Fatalf("close destroyed it again (%d)", n)
	}
}

// TestClaimNeverOvercommits: readers claiming the credits of their
// batches at once never set aside more than the send queue holds, less
// what is outstanding; a claim others hold is not free to anyone else.
func TestClaimNeverOvercommits(t *testing.T) {
	tx := &txPath{sendq: 8}
	tx.outstanding.Store(2)
	if got := tx.claim(5); got != 5 {
		t.Fatalf("claim 5 of 6 free: got %d", got)
	}
	if got := tx.claim(5); got != 1 {
		t.Fatalf("claim 5 of the 1 left: got %d", got)
	}
	if f := tx.creditsFree(); f != 0 {
		t.Fatalf("free %d with every credit claimed, want 0", f)
	}
	tx.unclaim(6)
	if f := tx.creditsFree(); f != 6 {
		t.Fatalf("free %d after the claims went back, want 6", f)
	}
	const readers, rounds = 4, 2000
	var wg sync.WaitGroup
	var over atomic.Int64
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				n := tx.claim(3)
				if c := tx.claimed.Load() + tx.outstanding.Load(); c > int64(tx.sendq) {
					over.Store(c)
				}
				tx.unclaim(n)
			}
		}()
	}
	wg.Wait()
	if c := over.Load(); c != 0 {
		t.Fatalf("claims and outstanding reached %d of %d credits", c, tx.sendq)
	}
	if c := tx.claimed.Load(); c != 0 {
		t.Fatalf("%d credits still claimed", c)
	}
}
