package offload

import (
	"encoding/binary"
	"fmt"
)

// TCP flag bits a segmenter rewrites.
const (
	tcpFIN = 0x01
	tcpPSH = 0x08
	tcpCWR = 0x80
)

// Segments is how many frames the packet becomes at mss bytes of L4
// payload per frame.
func (h Headers) Segments(mss int) int {
	pay := h.Len - h.End
	if mss <= 0 || pay <= 0 {
		return 1
	}
	return (pay + mss - 1) / mss
}

// SegmentLen is the length of segment i of the packet at mss.
func (h Headers) SegmentLen(mss, i int) int {
	return h.End + min(mss, max(0, h.Len-h.End-i*mss))
}

// Segment cuts the TCP or UDP packet at l3off in frame into frames that
// carry at most mss bytes of L4 payload each, written into out[0..n-1]
// (each resliced to its frame's length; each must be long enough for the
// repeated headers plus mss), with complete checksums. See
// Headers.SegmentInto for what each segment carries. A packet that fits
// in one segment comes back as one checksummed frame.
func Segment(frame []byte, l3off, mss int, out [][]byte) (int, error) {
	if mss <= 0 {
		return 0, ErrBadMSS
	}
	h, err := Parse(frame, l3off)
	if err != nil {
		return 0, err
	}
	n := h.Segments(mss)
	if n > len(out) {
		return 0, fmt.Errorf("%d segments of %d bytes, %d buffers: %w", n, mss, len(out), ErrTooManySegments)
	}
	for i := range n {
		size, err := h.SegmentInto(out[i], frame, mss, i, true)
		if err != nil {
			return i, err
		}
		out[i] = out[i][:size]
	}
	return n, nil
}

// SegmentInto writes segment i (of h.Segments(mss)) of the packet frame,
// whose headers h describes, into dst and returns its length. Each
// segment repeats the link header as it is and gets its own IP length and
// IPv4 ID (incremented per segment, as Linux's GSO does without the
// fixed-ID flag):
//
//   - TCP (TSO): the sequence number advances by the payload before; FIN
//     and PSH stay on the last segment only, CWR on the first only.
//   - UDP (USO, UDP_SEGMENT): each segment is a datagram of its own with
//     its own UDP length.
//
// The IPv4 header checksum is always filled. With csum the TCP/UDP
// checksum is complete; without, the field holds the segment's
// pseudo-header sum, the CHECKSUM_PARTIAL state CompletePartial finishes.
// The checksum fields of the input are ignored either way.
func (h Headers) SegmentInto(dst, frame []byte, mss, i int, csum bool) (int, error) {
	if mss <= 0 {
		return 0, ErrBadMSS
	}
	n := h.Segments(mss)
	if i < 0 || i >= n {
		return 0, fmt.Errorf("segment %d of %d: %w", i, n, ErrTooManySegments)
	}
	pay := frame[h.End:h.Len]
	chunk := pay[min(i*mss, len(pay)):min((i+1)*mss, len(pay))]
	size := h.End + len(chunk)
	if len(dst) < size {
		return 0, fmt.Errorf("segment %d needs %d bytes, buffer holds %d: %w", i, size, len(dst), ErrSegmentBuffer)
	}
	seg := dst[:size]
	copy(seg, frame[:h.End])
	copy(seg[h.End:], chunk)
	h.rewrite(seg, frame, mss, i, n, size)
	sh := h
	sh.Len = size
	if csum {
		fill(seg, &sh)
	} else {
		fillPartial(seg, &sh)
	}
	return size, nil
}

// rewrite sets segment i's own header fields in seg (whose first h.End
// bytes are the frame's headers), size bytes in all: IP length, IPv4 ID,
// TCP sequence and flags, or UDP length.
func (h Headers) rewrite(seg, frame []byte, mss, i, n, size int) {
	if h.IPv6 {
		binary.BigEndian.PutUint16(seg[h.L3+4:], uint16(size-h.L3-40))
	} else {
		binary.BigEndian.PutUint16(seg[h.L3+2:], uint16(size-h.L3))
		id := binary.BigEndian.Uint16(frame[h.L3+4:])
		binary.BigEndian.PutUint16(seg[h.L3+4:], id+uint16(i))
	}
	if h.Proto == ProtoTCP {
		seq := binary.BigEndian.Uint32(frame[h.L4+4:])
		binary.BigEndian.PutUint32(seg[h.L4+4:], seq+uint32(i*mss))
		f := frame[h.L4+13]
		if i != n-1 {
			f &^= tcpFIN | tcpPSH
		}
		if i != 0 {
			f &^= tcpCWR
		}
		seg[h.L4+13] = f
	} else {
		binary.BigEndian.PutUint16(seg[h.L4+4:], uint16(size-h.L4))
	}
}

// SegmentHeadersInto is SegmentInto for a sender that gathers: it writes
// only segment i's headers (h.End bytes) into dst, with complete
// checksums over them and the payload, and returns the payload as a
// slice of frame, so the segment is dst[:h.End] followed by chunk. It is
// how an HCA's LSO engine works: headers rebuilt per segment, the
// payload read where the work request holds it.
func (h Headers) SegmentHeadersInto(dst, frame []byte, mss, i int) (chunk []byte, err error) {
	if mss <= 0 {
		return nil, ErrBadMSS
	}
	n := h.Segments(mss)
	if i < 0 || i >= n {
		return nil, fmt.Errorf("segment %d of %d: %w", i, n, ErrTooManySegments)
	}
	if len(dst) < h.End {
		return nil, fmt.Errorf("segment %d headers need %d bytes, buffer holds %d: %w", i, h.End, len(dst), ErrSegmentBuffer)
	}
	pay := frame[h.End:h.Len]
	chunk = pay[min(i*mss, len(pay)):min((i+1)*mss, len(pay))]
	size := h.End + len(chunk)
	hdr := dst[:h.End]
	copy(hdr, frame[:h.End])
	h.rewrite(hdr, frame, mss, i, n, size)
	sh := h
	sh.Len = size
	fillSplit(hdr, chunk, &sh)
	return chunk, nil
}
