package rocev2

import (
	"errors"
	"net"
	"os"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// rxPacketLoop is rxLoop for a device whose datagrams come from its
// packet socket, each with the IP and UDP headers it had on the wire.
func (d *Device) rxPacketLoop() {
	defer d.wg.Done()
	r := newPacketReceiver(d.psock)
	var (
		p   wire.Packet
		f   packetFrame
		hdr [60 + wire.UDPHeaderLen]byte // a GSO segment's headers
	)
	for {
		n, err := r.read()
		if err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-d.done:
				return
			default:
			}
			d.cfg.Logger.Debug("rocev2: receive", "dev", d.cfg.Name, "err", err)
			continue
		}
		d.ctr.rxBatches.Add(1)
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return
		}
		for i := range n {
			b, netOff, truncated := r.message(i)
			if truncated {
				d.ctr.rxPackets.Add(1)
				d.ctr.drop(wire.DropTruncated)
				continue
			}
			if err := parsePacketFrame(b, netOff, &f); err != nil {
				d.ctr.rxPackets.Add(1)
				d.ctr.drop(wire.ReasonOf(err))
				continue
			}
			d.receiveFrame(&f, hdr[:], &p)
		}
		d.sendBatchAcks()
		d.unlock()
	}
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
