package tap

import (
	"sync/atomic"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
	"github.com/ipoibcm/ipoib/offload/gro"
)

// metaBridge bridges from -> to through the OffloadPort methods, frames
// and metadata as they are, optionally rewriting each Meta on the way. It
// counts reads that returned more than one frame and super frames seen.
type metaBridge struct {
	batches, supers, partial atomic.Int64
	maxBatch                 atomic.Int64
}

func (p *vnetPair) metaBridge(from, to *Device, mb *metaBridge, rewrite func(f []byte, m *offload.Meta)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		bufs := make([][]byte, 16)
		for i := range bufs {
			bufs[i] = make([]byte, vnetMaxFrame+1)
		}
		sizes := make([]int, len(bufs))
		meta := make([]offload.Meta, len(bufs))
		frames := make([][]byte, len(bufs))
		for {
			n, err := from.ReadFramesMeta(bufs, sizes, meta)
			if err != nil {
				return
			}
			if n > 1 {
				mb.batches.Add(1)
			}
			if int64(n) > mb.maxBatch.Load() {
				mb.maxBatch.Store(int64(n))
			}
			for i := range n {
				frames[i] = bufs[i][:sizes[i]]
				if meta[i].GSO != offload.GSONone && sizes[i] > EthHdrLen+vnetTestMTU {
					mb.supers.Add(1)
				}
				if meta[i].NeedsCsum {
					mb.partial.Add(1)
				}
				if rewrite != nil {
					rewrite(frames[i], &meta[i])
				}
			}
			if _, err := to.WriteFramesMeta(frames[:n], meta[:n]); err != nil {
				return
			}
		}
	}()
}

// TestVnetMetaPassthrough: ReadFramesMeta hands up the kernel's super
// frames and partial checksums as offload.Meta, WriteFramesMeta hands
// them to the other kernel as they are, and the stream arrives intact;
// reads return several frames when several are queued.
func TestVnetMetaPassthrough(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			p := newVnetPair(t, v6)
			var ab, ba metaBridge
			p.metaBridge(p.a, p.b, &ab, nil)
			p.metaBridge(p.b, p.a, &ba, nil)
			p.transfer(t, 16<<20)
			if ab.supers.Load() == 0 {
				t.Fatalf("no super frame above the %d-byte MTU came up as GSO meta", vnetTestMTU)
			}
			if ab.partial.Load() == 0 {
				t.Fatal("no partial checksum came up as NeedsCsum")
			}
			if ab.batches.Load()+ba.batches.Load() == 0 {
				t.Error("no read returned more than one frame")
			}
			t.Logf("a->b: %d super frames, %d multi-frame reads (largest %d); b->a: %d multi-frame reads",
				ab.supers.Load(), ab.batches.Load(), ab.maxBatch.Load(), ba.batches.Load())
			for r := VnetDropShort; int(r) < VnetDropReasons; r++ {
				if n := p.a.VnetDrops(r) + p.b.VnetDrops(r); n != 0 {
					t.Errorf("drops %v: %d", r, n)
				}
			}
		})
	}
}

// TestVnetSetOffloads: with TSO taken back at run time the kernel stops
// handing us super frames (it segments itself) but still leaves
// checksums partial; with nothing offered every frame is complete.
func TestVnetSetOffloads(t *testing.T) {
	for _, tc := range []struct {
		name            string
		want            offload.Caps
		supers, partial bool
	}{
		{"csum", offload.Caps{Csum: true}, false, true},
		{"none", offload.Caps{}, false, false},
		{"tso", offload.Caps{Csum: true, TSO4: true, TSO6: true}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newVnetPair(t, false)
			for _, d := range []*Device{p.a, p.b} {
				got, err := d.SetOffloads(tc.want)
				if err != nil {
					t.Fatalf("SetOffloads(%+v): %v", tc.want, err)
				}
				if got != tc.want {
					t.Fatalf("SetOffloads(%+v) in force %+v", tc.want, got)
				}
			}
			if want := (offload.Caps{Csum: true, TSO4: true, TSO6: true, USO: p.a.vnet.usoKnown}); p.a.HostOffloads() != want {
				t.Errorf("HostOffloads %+v, want %+v", p.a.HostOffloads(), want)
			}
			var ab, ba metaBridge
			p.metaBridge(p.a, p.b, &ab, nil)
			p.metaBridge(p.b, p.a, &ba, nil)
			p.transfer(t, 4<<20)
			if got := ab.supers.Load() > 0; got != tc.supers {
				t.Errorf("super frames seen %t, want %t", got, tc.supers)
			}
			if got := ab.partial.Load() > 0; got != tc.partial {
				t.Errorf("partial checksums seen %t, want %t", got, tc.partial)
			}
		})
	}
}

// TestVnetWriteDataValid: frames handed to the kernel with DataValid are
// not verified again. The bridge overwrites every TCP checksum with
// garbage and marks the frame DataValid; the stream still arrives intact,
// which it could not if the flag were not passed (the kernel would drop
// every segment).
func TestVnetWriteDataValid(t *testing.T) {
	p := newVnetPair(t, false)
	for _, d := range []*Device{p.a, p.b} {
		if _, err := d.SetOffloads(offload.Caps{Csum: true}); err != nil {
			t.Fatal(err)
		}
	}
	var ab, ba metaBridge
	spoil := func(f []byte, m *offload.Meta) {
		if !m.NeedsCsum || m.GSO != offload.GSONone {
			return
		}
		at := int(m.CsumStart) + int(m.CsumOffset)
		f[at], f[at+1] = 0xde, 0xad
		*m = offload.Meta{DataValid: true}
	}
	p.metaBridge(p.a, p.b, &ab, spoil)
	p.metaBridge(p.b, p.a, &ba, spoil)
	p.transfer(t, 4<<20)
	if ab.partial.Load() == 0 {
		t.Fatal("no partial checksum to spoil")
	}
}

// gatherBridge bridges from -> to with WriteFramesGather: each frame is
// cut into pieces by cut, or, with a coalescer, each read batch goes
// through GRO (gro.Config.Gather) and out as FlushVec's pieces. It counts
// frames written in more than one piece.
func (p *vnetPair) gatherBridge(from, to *Device, co *gro.Coalescer, cut func(f []byte, m *offload.Meta, pieces [][]byte) [][]byte, multi *atomic.Int64) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		bufs := make([][]byte, 16)
		for i := range bufs {
			bufs[i] = make([]byte, vnetMaxFrame+1)
		}
		sizes := make([]int, len(bufs))
		meta := make([]offload.Meta, len(bufs))
		var out [][][]byte
		var outMeta []offload.Meta
		for {
			n, err := from.ReadFramesMeta(bufs, sizes, meta)
			if err != nil {
				return
			}
			out, outMeta = out[:0], outMeta[:0]
			emit := func(pieces [][]byte, m offload.Meta) {
				if len(pieces) > 1 {
					multi.Add(1)
				}
				out, outMeta = append(out, pieces), append(outMeta, m)
			}
			for i := range n {
				f := bufs[i][:sizes[i]]
				if co != nil {
					co.Add(f, meta[i])
					continue
				}
				emit(cut(f, &meta[i], nil), meta[i])
			}
			if co != nil {
				co.FlushVec(emit)
			}
			if _, err := to.WriteFramesGather(out, outMeta); err != nil {
				return
			}
		}
	}()
}

// TestVnetWriteGather: frames written in pieces (WriteFramesGather)
// arrive as the frames the pieces make up. "cut": the kernel's super
// frames and segments, each cut in three at odd places, every fifth made
// DataValid (which cannot go gathered: its checksum field is rewritten on
// a joined copy); "gro": a TAP without TSO hands MTU-sized segments,
// which GRO gathers into super frames of headers plus payloads in place.
func TestVnetWriteGather(t *testing.T) {
	t.Run("cut", func(t *testing.T) {
		p := newVnetPair(t, false)
		var k int
		cut := func(f []byte, m *offload.Meta, pieces [][]byte) [][]byte {
			k++
			if k%5 == 0 && m.NeedsCsum {
				offload.CompletePartial(f, int(m.CsumStart), int(m.CsumOffset))
				*m = offload.Meta{GSO: m.GSO, GSOSize: m.GSOSize, ECN: m.ECN, DataValid: true}
			}
			a, b := min(len(f), 1+k%13), min(len(f), 60+k%7)
			return append(pieces, f[:a], f[a:b], f[b:])
		}
		var multi atomic.Int64
		var ba metaBridge
		p.gatherBridge(p.a, p.b, nil, cut, &multi)
		p.metaBridge(p.b, p.a, &ba, nil)
		p.transfer(t, 8<<20)
		if multi.Load() == 0 {
			t.Fatal("no frame went in pieces")
		}
	})
	t.Run("gro", func(t *testing.T) {
		p := newVnetPair(t, false)
		if _, err := p.a.SetOffloads(offload.Caps{Csum: true}); err != nil {
			t.Fatal(err)
		}
		co, err := gro.New(gro.Config{L3Off: EthHdrLen, Gather: true})
		if err != nil {
			t.Fatal(err)
		}
		var multi atomic.Int64
		var ba metaBridge
		p.gatherBridge(p.a, p.b, co, nil, &multi)
		p.metaBridge(p.b, p.a, &ba, nil)
		p.transfer(t, 8<<20)
		st := co.Stats()
		if st.Frames == 0 || multi.Load() == 0 {
			t.Fatalf("GRO built %d super frames, %d written in pieces", st.Frames, multi.Load())
		}
		t.Logf("GRO: %d super frames of %d segments; %d frames written in pieces", st.Frames, st.Segments, multi.Load())
	})
}
