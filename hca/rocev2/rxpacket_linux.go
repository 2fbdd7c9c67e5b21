package rocev2

import "github.com/ipoibcm/ipoib/hca/rocev2/wire"

// deliver implements rxSource for the packet socket: each message is a
// frame with the IP and UDP headers it had on the wire.
func (r *packetReceiver) deliver(d *Device, i int) {
	b, netOff, truncated := r.message(i)
	if truncated {
		d.ctr.rxPackets.Add(1)
		d.ctr.drop(wire.DropTruncated)
		return
	}
	if err := parsePacketFrame(b, netOff, &r.frame); err != nil {
		d.ctr.rxPackets.Add(1)
		d.ctr.drop(wire.ReasonOf(err))
		return
	}
	d.receiveFrame(&r.frame, r.segHdr[:], &r.pkt)
}

// receiveFrame validates the datagrams of one packet-socket frame and
// hands each to its QP; hdr is room for a segment's headers. mu held.
func (d *Device) receiveFrame(f *packetFrame, hdr []byte, p *wire.Packet) {
	segs := f.segments()
	if segs > 1 {
		d.ctr.rxGROMessages.Add(1)
	}
	allowed := d.allowed(f.from.Addr())
	for i := range segs {
		pkt, ipHdr, udpHdr := f.segment(i, hdr)
		d.ctr.rxPackets.Add(1)
		d.ctr.rxBytes.Add(uint64(len(pkt)))
		switch {
		case !allowed:
			d.ctr.drop(wire.DropNotAllowed)
		case len(pkt) > d.maxPacket:
			d.ctr.drop(wire.DropTruncated)
			d.warnOversize(f.from, len(pkt))
		case d.acceptWithHeaders(pkt, ipHdr, udpHdr, f.from, f.dst.Addr(), p):
			d.deliver(p, f.from)
		}
	}
}
