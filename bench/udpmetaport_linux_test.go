package bench

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/offload"
)

// metaPortPair is two UDPMetaPorts on loopback sending to each other.
func metaPortPair(t *testing.T, seg int) (a, b *UDPMetaPort) {
	t.Helper()
	ca, cb := listenLoopback(t), listenLoopback(t)
	var err error
	caps := offload.Caps{Csum: true, TSO4: true, TSO6: true}
	if a, err = NewUDPMetaPort(ca, cb.LocalAddr().(*net.UDPAddr).AddrPort(), seg, caps); err != nil {
		t.Fatal(err)
	}
	if b, err = NewUDPMetaPort(cb, ca.LocalAddr().(*net.UDPAddr).AddrPort(), seg, caps); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

type readResult struct {
	frame []byte
	meta  offload.Meta
	err   error
}

// reader reads frames from p into a channel until p is closed.
func reader(p *UDPMetaPort) <-chan readResult {
	out := make(chan readResult, 64)
	go func() {
		defer close(out)
		bufs, sizes, meta := [][]byte{make([]byte, maxMetaFrame)}, make([]int, 1), make([]offload.Meta, 1)
		for {
			n, err := p.ReadFramesMeta(bufs, sizes, meta)
			if err != nil {
				out <- readResult{err: err}
				return
			}
			if n == 1 {
				out <- readResult{frame: bytes.Clone(bufs[0][:sizes[0]]), meta: meta[0]}
			}
		}
	}()
	return out
}

func nextFrame(t *testing.T, c <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("read: %v", r.err)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no frame")
		return readResult{}
	}
}

func testFrame(n int) []byte {
	f := make([]byte, n)
	for i := range f {
		f[i] = byte(i*7 + n)
	}
	return f
}

// TestUDPMetaPortCarriesFramesWithMeta: frames of every size around the
// segment and send boundaries arrive whole with their metadata, at two
// segment sizes.
func TestUDPMetaPortCarriesFramesWithMeta(t *testing.T) {
	for _, seg := range []int{1472, 8972} {
		a, b := metaPortPair(t, seg)
		got := reader(b)
		chunk := seg - udpSegHdrLen
		perSend := min(MaxUDPPipeFrame/seg, 64)
		sizes := []int{1, 60, chunk - 1, chunk, chunk + 1, perSend * chunk, perSend*chunk + 1, min(2*perSend*chunk+3, maxMetaFrame-1), maxMetaFrame}
		metas := []offload.Meta{
			{},
			{NeedsCsum: true, CsumStart: 34, CsumOffset: 16},
			{GSO: offload.GSOTCPv4, GSOSize: 1448, NeedsCsum: true, CsumStart: 34, CsumOffset: 16, ECN: true},
			{DataValid: true},
		}
		for i, n := range sizes {
			f, m := testFrame(n), metas[i%len(metas)]
			if w, err := a.WriteFramesMeta([][]byte{f}, []offload.Meta{m}); w != 1 || err != nil {
				t.Fatalf("seg %d: write %d bytes: %d, %v", seg, n, w, err)
			}
			r := nextFrame(t, got)
			if !bytes.Equal(r.frame, f) {
				t.Fatalf("seg %d: frame of %d bytes arrived as %d bytes (or different)", seg, n, len(r.frame))
			}
			if r.meta != m {
				t.Fatalf("seg %d: frame of %d bytes: meta %+v, sent %+v", seg, n, r.meta, m)
			}
		}
		// A batch of frames in one call arrives in order.
		batch := [][]byte{testFrame(100), testFrame(maxMetaFrame), testFrame(3000)}
		if w, err := a.WriteFramesMeta(batch, nil); w != 3 || err != nil {
			t.Fatalf("seg %d: batch: %d, %v", seg, w, err)
		}
		for _, f := range batch {
			if r := nextFrame(t, got); !bytes.Equal(r.frame, f) {
				t.Fatalf("seg %d: batch frame of %d bytes arrived as %d", seg, len(f), len(r.frame))
			}
		}
		if d := b.Dropped.Load(); d != 0 {
			t.Fatalf("seg %d: %d dropped", seg, d)
		}
	}
}

// TestUDPMetaPortDropsWhatDoesNotFit: garbage, a segment that continues no
// frame and a frame cut short are counted and never delivered; the next
// whole frame is.
func TestUDPMetaPortDropsWhatDoesNotFit(t *testing.T) {
	const seg = 1472
	_, b := metaPortPair(t, seg)
	got := reader(b)
	raw := listenLoopback(t)
	defer raw.Close()
	to := b.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	send := func(d []byte) {
		t.Helper()
		if _, err := raw.WriteToUDPAddrPort(d, to); err != nil {
			t.Fatal(err)
		}
	}
	segment := func(frameLen, off, n int) []byte {
		d := make([]byte, udpSegHdrLen+n)
		binary.BigEndian.PutUint32(d, uint32(frameLen))
		binary.BigEndian.PutUint32(d[4:], uint32(off))
		copy(d[udpSegHdrLen:], testFrame(frameLen)[off:off+n])
		return d
	}
	chunk := seg - udpSegHdrLen
	send([]byte("short"))                       // shorter than a header
	send(segment(3*chunk, chunk, chunk))        // continues no frame
	send(segment(3*chunk, 0, chunk))            // a frame begun...
	send(segment(2*chunk, 0, chunk))            // ...and a new one before it ended
	send(segment(2*chunk, chunk, chunk))        // which this completes
	send(segment(maxMetaFrame+1, 0, chunk))     // longer than any frame
	send(append(segment(100, 0, 100), 0, 0, 0)) // bytes beyond its frame
	if r := nextFrame(t, got); !bytes.Equal(r.frame, testFrame(2*chunk)) {
		t.Fatalf("got %d bytes, want the %d-byte frame", len(r.frame), 2*chunk)
	}
	send(segment(100, 0, 100))
	if r := nextFrame(t, got); !bytes.Equal(r.frame, testFrame(100)) {
		t.Fatalf("got %d bytes, want the 100-byte frame", len(r.frame))
	}
	if d := b.Dropped.Load(); d != 5 {
		t.Fatalf("dropped %d, want 5 (short, no frame, cut-off frame, too long, beyond)", d)
	}
	if _, err := NewUDPMetaPort(raw, to, minUDPMetaSeg-1, offload.Caps{}); err == nil {
		t.Fatal("segment size below the minimum accepted")
	}
}
