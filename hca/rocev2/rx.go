package rocev2

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// rxSource is what the receive loop reads from: the UDP socket
// (receiver) or, for an IPv4 device, the packet socket that shows the IP
// headers (packetReceiver). Each belongs to the receive goroutine.
type rxSource interface {
	// read blocks until at least one message arrived and returns how
	// many.
	read() (int, error)
	// deliver validates the datagrams of message i of the last read and
	// hands each to its QP; mu held.
	deliver(d *Device, i int)
}

// rxLoop reads datagrams in batches and processes each batch under one
// lock acquisition, then sends the batch's coalesced ACKs.
func (d *Device) rxLoop(src rxSource) {
	defer d.wg.Done()
	for {
		n, err := src.read()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
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
			src.deliver(d, i)
		}
		d.sendBatchAcks()
		d.unlock()
	}
}

// sendBatchAcks sends the coalesced ACKs a received batch left pending.
// mu held.
func (d *Device) sendBatchAcks() {
	for _, q := range d.ackQPs {
		if q.ackPending {
			q.ackPending = false
			if !q.destroyed.Load() && q.state != hca.QPStateError {
				q.sendAck(wire.SyndromeACK, q.ackPSN)
			}
		}
	}
	clear(d.ackQPs)
	d.ackQPs = d.ackQPs[:0]
}

// warnOversize reports, rate-limited, a datagram larger than this
// device's IB MTU allows: the peer runs a larger --ib-mtu, and everything
// it sends in full-size packets is lost here.
func (d *Device) warnOversize(from netip.AddrPort, n int) {
	d.warnRxTooBig.warn(d.cfg.Logger, time.Now(), 1, "rocev2: datagram larger than our IB MTU, dropped: the peer uses a larger --ib-mtu",
		"dev", d.cfg.Name, "from", from, "bytes", n, "max", d.maxPacket, "ib_mtu", int(d.cfg.MTU))
}

// receiveMessage splits a received buffer into its datagrams: seg bytes
// each (the last may be shorter) when GRO coalesced them, else one.
// mu held.
func (d *Device) receiveMessage(b []byte, from netip.AddrPort, seg int, p *wire.Packet) {
	if seg <= 0 || seg >= len(b) {
		seg = len(b)
	} else {
		d.ctr.rxGROMessages.Add(1)
	}
	allowed := d.allowed(from.Addr())
	for {
		n := min(seg, len(b))
		d.ctr.rxPackets.Add(1)
		d.ctr.rxBytes.Add(uint64(n))
		if !allowed {
			d.ctr.drop(wire.DropNotAllowed)
		} else if n > d.maxPacket {
			d.ctr.drop(wire.DropTruncated)
			d.warnOversize(from, n)
		} else {
			d.receive(b[:n], from, p)
		}
		if b = b[n:]; len(b) == 0 {
			return
		}
	}
}

// receive validates one datagram and hands it to its QP. mu held.
func (d *Device) receive(b []byte, from netip.AddrPort, p *wire.Packet) {
	if d.accept(b, from, d.local.Addr(), p) {
		d.deliver(p, from)
	}
}

// deliver hands an accepted packet to its QP. mu held.
func (d *Device) deliver(p *wire.Packet, from netip.AddrPort) {
	switch op := p.BTH.Opcode; {
	case op == wire.OpUDSendOnly:
		d.recvUD(p, from.Addr())
	case op.IsRCSend(), op == wire.OpRCAck:
		q := d.qps[hca.QPN(p.BTH.DestQP)]
		switch {
		case q == nil:
			d.ctr.drop(wire.DropUnknownQP)
		case q.typ != hca.QPTypeRC:
			d.ctr.drop(wire.DropWrongState)
		case !hca.PKey(p.BTH.PKey).Matches(q.pkey()):
			d.ctr.drop(wire.DropBadPKey)
		case op == wire.OpRCAck:
			q.recvAck(p)
		default:
			q.recvRequest(p, from.Addr())
		}
	default:
		// CNPs and anything else parsed but not carried here.
		d.ctr.drop(wire.DropBadOpcode)
	}
}

// accept parses a datagram sent from from to dst (this device's address
// or a group it joined), checks its ICRC, P_Key and family, shows it to
// the tap and learns its sender; false if it was dropped (counted). mu
// held.
func (d *Device) accept(b []byte, from netip.AddrPort, dst netip.Addr, p *wire.Packet) bool {
	if err := wire.ParsePacket(b, p); err != nil {
		d.ctr.drop(wire.ReasonOf(err))
		return false
	}
	hdr := &d.ipUDP
	udpLen := wire.UDPHeaderLen + len(b)
	if from.Addr().Is4() != d.local.Addr().Is4() {
		d.ctr.drop(wire.DropGarbage)
		return false
	}
	n := wire.PutIPHeader(hdr[:], from.Addr(), dst, udpLen)
	wire.PutUDPHeader(hdr[n:], from.Port(), d.local.Port(), udpLen)
	// The sender's IPv4 ID is not visible here: accept the IDs a GSO
	// sender gives its segments (0 for a plain send).
	if _, err := wire.CheckICRCGSO(hdr[:n], hdr[n:n+wire.UDPHeaderLen], b, &d.rxShifts); err != nil {
		d.ctr.drop(wire.ReasonOf(err))
		return false
	}
	return d.admit(b, from, dst, p)
}

// acceptWithHeaders is accept for a datagram received with its IP and
// UDP headers (the packet socket): its ICRC is checked over them, the
// IPv4 ID included. mu held.
func (d *Device) acceptWithHeaders(b, ipHdr, udpHdr []byte, from netip.AddrPort, dst netip.Addr, p *wire.Packet) bool {
	if err := wire.ParsePacket(b, p); err != nil {
		d.ctr.drop(wire.ReasonOf(err))
		return false
	}
	if err := wire.CheckICRC(ipHdr, udpHdr, b); err != nil {
		d.ctr.drop(wire.ReasonOf(err))
		return false
	}
	return d.admit(b, from, dst, p)
}

// admit shows a parsed datagram whose ICRC is right to the tap, checks
// its P_Key and learns its sender; false if it was dropped (counted). mu
// held.
func (d *Device) admit(b []byte, from netip.AddrPort, dst netip.Addr, p *wire.Packet) bool {
	if d.cfg.Tap != nil {
		d.cfg.Tap.Datagram(from, netip.AddrPortFrom(dst, d.local.Port()), b)
	}
	if _, ok := hca.MatchingPKeyIndex(d.pkeys, hca.PKey(p.BTH.PKey)); !ok {
		// No partition of ours (IBTA 10.9.3), before the sender may
		// join the broadcast group: a host of another partition stays
		// out of it.
		if p.BTH.Opcode == wire.OpUDSendOnly {
			d.ctr.dropUD(wire.DropBadPKey)
		} else {
			d.ctr.drop(wire.DropBadPKey)
		}
		return false
	}
	if sp := from.Port(); sp == d.local.Port() || sp >= wire.SourcePortMin {
		// A peer's QPs send from the fabric port or from per-QP ports
		// in the RoCEv2 entropy range.
		d.addMember(from.Addr())
	}
	return true
}
