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

// Segments is how many frames Segment cuts the packet into.
func Segments(h Headers, mss int) int {
	pay := h.Len - h.End
	if mss <= 0 || pay <= 0 {
		return 1
	}
	return (pay + mss - 1) / mss
}

// Segment cuts the TCP or UDP packet at l3off in frame into frames that
// carry at most mss bytes of L4 payload each, written into out[0..n-1]
// (each resliced to its frame's length; each must be long enough for the
// repeated headers plus mss). Every segment repeats the link header as it
// is and gets its own IP length, IPv4 ID (incremented per segment, as
// Linux's GSO does without the fixed-ID flag), and complete IPv4 and
// TCP/UDP checksums:
//
//   - TCP (TSO): sequence numbers advance by the payload before; FIN and
//     PSH stay on the last segment only, CWR on the first only.
//   - UDP (USO, UDP_SEGMENT): each segment is a datagram of its own with
//     its own UDP length.
//
// The checksum fields of the input are ignored (partial or absent). A
// packet that fits in one segment comes back as one checksummed frame.
func Segment(frame []byte, l3off, mss int, out [][]byte) (int, error) {
	if mss <= 0 {
		return 0, ErrBadMSS
	}
	h, err := Parse(frame, l3off)
	if err != nil {
		return 0, err
	}
	n := Segments(h, mss)
	if n > len(out) {
		return 0, fmt.Errorf("%d segments of %d bytes, %d buffers: %w", n, mss, len(out), ErrTooManySegments)
	}
	hdr := frame[:h.End]
	pay := frame[h.End:h.Len]
	var id uint16
	var seq uint32
	var flags byte
	if !h.IPv6 {
		id = binary.BigEndian.Uint16(frame[h.L3+4:])
	}
	if h.Proto == ProtoTCP {
		seq = binary.BigEndian.Uint32(frame[h.L4+4:])
		flags = frame[h.L4+13]
	}
	for i := range n {
		chunk := pay[min(i*mss, len(pay)):min((i+1)*mss, len(pay))]
		size := len(hdr) + len(chunk)
		if len(out[i]) < size {
			return i, fmt.Errorf("segment %d needs %d bytes, buffer holds %d: %w", i, size, len(out[i]), ErrSegmentBuffer)
		}
		seg := out[i][:size]
		copy(seg, hdr)
		copy(seg[len(hdr):], chunk)
		sh := h
		sh.Len = size
		if h.IPv6 {
			binary.BigEndian.PutUint16(seg[h.L3+4:], uint16(size-h.L3-40))
		} else {
			binary.BigEndian.PutUint16(seg[h.L3+2:], uint16(size-h.L3))
			binary.BigEndian.PutUint16(seg[h.L3+4:], id+uint16(i))
		}
		if h.Proto == ProtoTCP {
			binary.BigEndian.PutUint32(seg[h.L4+4:], seq+uint32(i*mss))
			f := flags
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
		fill(seg, &sh)
		out[i] = seg
	}
	return n, nil
}
