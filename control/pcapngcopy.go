package control

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A capture stream is a pcapng file; its client writes it out in whole
// blocks only, so that the file ends at a block boundary whenever the
// stream stops (the user interrupts, the server dies, the connection
// breaks) and a reader never finds it cut short in the middle of a
// packet.
const (
	pcapngSHBType   = 0x0A0D0D0A // reads the same in either byte order
	pcapngByteOrder = 0x1A2B3C4D
	// maxPcapngBlock bounds one block so a corrupt length cannot make the
	// client allocate without limit: a capture's largest is one packet of
	// a UD LSO datagram (64 KiB) with its headers and comment.
	maxPcapngBlock = 1 << 20
	// pcapngFlushAt is how much of whole blocks is gathered before a
	// write when more is already waiting.
	pcapngFlushAt = 256 << 10
)

var (
	// errPcapngStream is wrapped by every malformed-stream error.
	errPcapngStream = errors.New("malformed pcapng stream")
	// errCaptureOut is wrapped by every failure to write the capture out.
	errCaptureOut = errors.New("write capture")
)

// copyPcapngBlocks copies the pcapng stream r to w and returns the bytes
// written. Every write to w holds whole blocks: blocks are gathered while
// r already holds more, and written when it would block or pcapngFlushAt
// is reached, so a live reader of w sees each block as it arrives. When r
// ends inside a block, that block is not written and the error says how
// much of it was dropped; a stream that is not pcapng, or has a block
// whose lengths disagree, ends the copy with an error at the last good
// block.
func copyPcapngBlocks(w io.Writer, r *bufio.Reader) (int64, error) {
	var (
		order   binary.ByteOrder
		pending []byte // whole blocks not yet written
		written int64
	)
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		n, err := w.Write(pending)
		written += int64(n)
		pending = pending[:0]
		if err != nil {
			return fmt.Errorf("%w: %w", errCaptureOut, err)
		}
		return nil
	}
	for {
		if len(pending) >= pcapngFlushAt || len(pending) > 0 && r.Buffered() == 0 {
			if err := flush(); err != nil {
				return written, err
			}
		}
		start := len(pending)
		block, err := readPcapngBlock(r, pending, &order)
		if err != nil {
			ferr := flush()
			if errors.Is(err, io.EOF) && len(block) == start {
				return written, ferr // the stream ended between blocks
			}
			return written, errors.Join(fmt.Errorf("capture stream: %d bytes of an incomplete block dropped: %w", len(block)-start, err), ferr)
		}
		pending = block
	}
}

// readPcapngBlock appends the next block of r to b. order is the byte
// order of the current section, set by each section header block; before
// the first one, nothing but a section header is accepted. On error the
// returned slice holds b and what was read of the broken block.
func readPcapngBlock(r *bufio.Reader, b []byte, order *binary.ByteOrder) ([]byte, error) {
	start := len(b)
	b, err := readAppend(r, b, 8)
	if err != nil {
		return b, err
	}
	typ := binary.LittleEndian.Uint32(b[start:])
	if typ == pcapngSHBType {
		if b, err = readAppend(r, b, 4); err != nil {
			return b, noEOF(err)
		}
		switch bom := b[start+8:]; {
		case binary.LittleEndian.Uint32(bom) == pcapngByteOrder:
			*order = binary.LittleEndian
		case binary.BigEndian.Uint32(bom) == pcapngByteOrder:
			*order = binary.BigEndian
		default:
			return b, fmt.Errorf("section header byte-order magic % x: %w", bom, errPcapngStream)
		}
	} else if *order == nil {
		return b, fmt.Errorf("first block of type %#x is not a section header: %w", typ, errPcapngStream)
	}
	n := (*order).Uint32(b[start+4:])
	if n < 12 || n%4 != 0 || n > maxPcapngBlock || typ == pcapngSHBType && n < 28 {
		return b, fmt.Errorf("block of type %#x with length %d: %w", typ, n, errPcapngStream)
	}
	if b, err = readAppend(r, b, int(n)-(len(b)-start)); err != nil {
		return b, noEOF(err)
	}
	if trail := (*order).Uint32(b[len(b)-4:]); trail != n {
		return b, fmt.Errorf("block of type %#x: length %d, trailing length %d: %w", typ, n, trail, errPcapngStream)
	}
	return b, nil
}

// readAppend appends exactly n bytes of r to b; io.EOF only if none were
// there, io.ErrUnexpectedEOF if some.
func readAppend(r io.Reader, b []byte, n int) ([]byte, error) {
	start := len(b)
	b = append(b, make([]byte, n)...)
	m, err := io.ReadFull(r, b[start:])
	return b[:start+m], err
}

// noEOF turns io.EOF inside a block into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
