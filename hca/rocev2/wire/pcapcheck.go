package wire

import (
	"errors"
	"fmt"
	"io"
)

// ICRCReport counts what CheckPcapICRC found.
type ICRCReport struct {
	Frames    int // records in the capture
	RoCEv2    int // UDP datagrams to or from the RoCEv2 port
	Good      int // of those, ICRC verified
	Bad       int // ICRC mismatch
	Malformed int // cut or inconsistent headers
	Other     int // not RoCEv2 (other protocols or ports)
	// GSOFrames counts RoCEv2 frames that were UDP GSO super-packets
	// (captured before segmentation) and verified segment by segment;
	// GSOSegments counts their datagrams.
	GSOFrames, GSOSegments int
	// FirstBad names the first failing frame (1-based, as tshark numbers
	// them) and why.
	FirstBad string
}

// OK reports whether there was RoCEv2 traffic and all of it verified.
func (r ICRCReport) OK() bool { return r.RoCEv2 > 0 && r.Bad == 0 && r.Malformed == 0 }

func (r ICRCReport) String() string {
	s := fmt.Sprintf("frames %d, rocev2 %d, icrc ok %d, icrc bad %d, malformed %d, other %d", r.Frames, r.RoCEv2, r.Good, r.Bad, r.Malformed, r.Other)
	if r.GSOFrames > 0 {
		s += fmt.Sprintf(" (%d GSO super-frames of %d datagrams)", r.GSOFrames, r.GSOSegments)
	}
	if r.FirstBad != "" {
		s += "; first failure: " + r.FirstBad
	}
	return s
}

// CheckPcapICRC reads a classic pcap and verifies the ICRC of every RoCEv2
// datagram to or from port in it, the check tshark does not make. Only an
// unreadable capture is an error; bad frames are counted.
func CheckPcapICRC(r io.Reader, port uint16) (ICRCReport, error) {
	var rep ICRCReport
	pr, err := NewPcapReader(r)
	if err != nil {
		return rep, err
	}
	for {
		frame, orig, err := pr.Next()
		if errors.Is(err, io.EOF) {
			return rep, nil
		}
		if err != nil {
			return rep, fmt.Errorf("frame %d: %w", rep.Frames+1, err)
		}
		rep.Frames++
		n := rep.Frames
		fail := func(why string) {
			if rep.FirstBad == "" {
				rep.FirstBad = fmt.Sprintf("frame %d: %s", n, why)
			}
		}
		ip, ok, err := IPPacket(pr.LinkType, frame)
		if err != nil {
			return rep, fmt.Errorf("frame %d: %w", n, err)
		}
		if !ok {
			rep.Other++
			continue
		}
		ipHdr, udpHdr, pkt, ok, err := RoCEv2Datagram(ip, port)
		switch {
		case err != nil && orig > len(frame):
			// The snap length cut it: nothing to check, but say so.
			rep.RoCEv2++
			rep.Malformed++
			fail(fmt.Sprintf("captured %d of %d bytes (raise the snap length)", len(frame), orig))
			continue
		case err != nil:
			rep.RoCEv2++
			rep.Malformed++
			fail(err.Error())
			continue
		case !ok:
			rep.Other++
			continue
		}
		rep.RoCEv2++
		switch err := CheckICRC(ipHdr, udpHdr, pkt); {
		case err == nil:
			rep.Good++
		case errors.Is(err, DropBadICRC):
			if n, err := CheckGSOSuperFrame(ipHdr, udpHdr, pkt); err == nil {
				rep.Good++
				rep.GSOFrames++
				rep.GSOSegments += n
				continue
			}
			rep.Bad++
			fail("ICRC mismatch")
		default:
			rep.Malformed++
			fail(err.Error())
		}
	}
}
