package control

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"testing"
	"testing/iotest"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// pcapngStream is a capture of n packets of growing size and the offsets
// where its blocks end.
func pcapngStream(t testing.TB, n int) ([]byte, []int) {
	var buf bytes.Buffer
	pw, err := wire.NewPcapngWriter(&buf, "test", []wire.PcapngInterface{{Name: "fabric", LinkType: wire.LinkTypeRaw}})
	if err != nil {
		t.Fatal(err)
	}
	var ends []int
	for b := buf.Bytes(); len(b) > 0; {
		l := int(binary.LittleEndian.Uint32(b[4:]))
		ends = append(ends, buf.Len()-len(b)+l)
		b = b[l:]
	}
	for k := range n {
		if err := pw.WritePacket(0, time.Unix(int64(k), 0), make([]byte, 1+k*37), ""); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, buf.Len())
	}
	return buf.Bytes(), ends
}

// writeLog records each Write, to check that every one holds whole blocks.
type writeLog struct {
	bytes.Buffer
	writes [][]byte
}

func (w *writeLog) Write(b []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(b))
	return w.Buffer.Write(b)
}

// TestCopyPcapngBlocksEndsAtABlock cuts a stream at every byte: the copy
// is the longest prefix of whole blocks, an error says a partial block
// was dropped exactly when there was one, and every write holds whole
// blocks, whatever sizes the reads return.
func TestCopyPcapngBlocksEndsAtABlock(t *testing.T) {
	stream, ends := pcapngStream(t, 40)
	for cut := 0; cut <= len(stream); cut++ {
		want, atBoundary := 0, cut == 0
		for _, e := range ends {
			if e <= cut {
				want = e
			}
			atBoundary = atBoundary || e == cut
		}
		var out writeLog
		n, err := copyPcapngBlocks(&out, bufio.NewReaderSize(iotest.HalfReader(bytes.NewReader(stream[:cut])), 64))
		if n != int64(want) || !bytes.Equal(out.Bytes(), stream[:want]) {
			t.Fatalf("cut at %d: copied %d bytes, want the %d of whole blocks", cut, n, want)
		}
		if atBoundary != (err == nil) || err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("cut at %d (block boundary %v): err %v", cut, atBoundary, err)
		}
		at := 0
		for _, w := range out.writes {
			at += len(w)
			if !slices.Contains(ends, at) {
				t.Fatalf("cut at %d: a write ends at %d, inside a block", cut, at)
			}
		}
	}
}

// TestCopyPcapngBlocksRejects: not pcapng, a wrong byte-order magic, a
// length that is not a multiple of 4 or disagrees with the trailer.
func TestCopyPcapngBlocksRejects(t *testing.T) {
	stream, ends := pcapngStream(t, 3)
	mod := func(f func(b []byte)) []byte { b := bytes.Clone(stream); f(b); return b }
	for name, tc := range map[string]struct {
		in   []byte
		keep int
	}{
		"classic pcap":     {mod(func(b []byte) { binary.LittleEndian.PutUint32(b, 0xa1b2c3d4) }), 0},
		"byte-order magic": {mod(func(b []byte) { b[8] ^= 0xff }), 0},
		"odd length":       {mod(func(b []byte) { binary.LittleEndian.PutUint32(b[ends[1]+4:], 37) }), ends[1]},
		"trailer":          {mod(func(b []byte) { b[ends[2]-1] ^= 1 }), ends[1]},
		"huge length":      {mod(func(b []byte) { binary.LittleEndian.PutUint32(b[ends[1]+4:], 1<<30) }), ends[1]},
	} {
		var out bytes.Buffer
		_, err := copyPcapngBlocks(&out, bufio.NewReader(bytes.NewReader(tc.in)))
		if !errors.Is(err, errPcapngStream) || !bytes.Equal(out.Bytes(), tc.in[:tc.keep]) {
			t.Errorf("%s: err %v, copied %d bytes, want errPcapngStream after %d", name, err, out.Len(), tc.keep)
		}
	}
}

// TestCopyPcapngBlocksBigEndian: a section in the other byte order is
// copied as it is.
func TestCopyPcapngBlocksBigEndian(t *testing.T) {
	var shb []byte
	for _, v := range []uint32{0x0A0D0D0A, 28, 0x1A2B3C4D} {
		shb = binary.BigEndian.AppendUint32(shb, v)
	}
	shb = binary.BigEndian.AppendUint16(shb, 1)
	shb = binary.BigEndian.AppendUint16(shb, 0)
	shb = binary.BigEndian.AppendUint64(shb, ^uint64(0))
	shb = binary.BigEndian.AppendUint32(shb, 28)
	var out bytes.Buffer
	if n, err := copyPcapngBlocks(&out, bufio.NewReader(bytes.NewReader(shb))); err != nil || n != 28 {
		t.Fatalf("big-endian section header: %d bytes, %v", n, err)
	}
}

// FuzzCopyPcapngBlocks: whatever arrives, the copy is a prefix of it, is
// itself whole blocks (copying it again gives it back without error), and
// a stream of whole blocks is copied entire.
func FuzzCopyPcapngBlocks(f *testing.F) {
	stream, ends := pcapngStream(f, 4)
	f.Add(stream)
	f.Add(stream[:ends[2]+5])
	f.Add([]byte{0x0a, 0x0d, 0x0d, 0x0a, 0x1c, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		n, err := copyPcapngBlocks(&out, bufio.NewReaderSize(bytes.NewReader(in), 16))
		if n != int64(out.Len()) || !bytes.HasPrefix(in, out.Bytes()) {
			t.Fatalf("copied %d bytes (reported %d), not a prefix of the input", out.Len(), n)
		}
		var again bytes.Buffer
		if _, err := copyPcapngBlocks(&again, bufio.NewReader(bytes.NewReader(out.Bytes()))); err != nil || !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("the copy is not whole blocks: %v", err)
		}
		if err == nil && out.Len() != len(in) {
			t.Fatalf("no error, but %d of %d bytes copied", out.Len(), len(in))
		}
	})
}
