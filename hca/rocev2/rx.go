package rocev2

import (
	"errors"
	"net"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// rxBatch is how many datagrams one recvmmsg may return.
const rxBatch = 64

// rxBufSize leaves room beyond the largest valid packet so that an
// oversized datagram shows as too long rather than silently cut.
const rxBufSize = 8192

// rxLoop reads datagrams in batches and processes each batch under one
// lock acquisition, then sends the batch's coalesced ACKs.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	r := newReceiver(d.sock, rxBatch, rxBufSize)
	var p wire.Packet
	for {
		n, err := r.read()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
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
			b, from, ok, truncated := r.datagram(i)
			d.ctr.rxPackets.Add(1)
			d.ctr.rxBytes.Add(uint64(len(b)))
			switch {
			case !ok:
				d.ctr.drop(wire.DropGarbage)
			case truncated || len(b) > d.maxPacket:
				d.ctr.drop(wire.DropTruncated)
			default:
				d.receive(b, from, &p)
			}
		}
		for _, q := range d.ackQPs {
			if q.ackPending {
				q.ackPending = false
				if !q.destroyed && q.state != hca.QPStateError {
					q.sendAck(wire.SyndromeACK, q.ackPSN)
				}
			}
		}
		clear(d.ackQPs)
		d.ackQPs = d.ackQPs[:0]
		d.unlock()
		if d.hooks.afterRxBatch != nil {
			d.hooks.afterRxBatch()
		}
	}
}

// receive validates one datagram and hands it to its QP. mu held.
func (d *Device) receive(b []byte, from netip.AddrPort, p *wire.Packet) {
	if err := wire.ParsePacket(b, p); err != nil {
		d.ctr.drop(wire.ReasonOf(err))
		return
	}
	var hdr [wire.IPv6HeaderLen + wire.UDPHeaderLen]byte
	udpLen := wire.UDPHeaderLen + len(b)
	if from.Addr().Is4() != d.local.Addr().Is4() {
		d.ctr.drop(wire.DropGarbage)
		return
	}
	n := wire.PutIPHeader(hdr[:], from.Addr(), d.local.Addr(), udpLen)
	wire.PutUDPHeader(hdr[n:], from.Port(), d.local.Port(), udpLen)
	if err := wire.CheckICRC(hdr[:n], hdr[n:n+wire.UDPHeaderLen], b); err != nil {
		d.ctr.drop(wire.ReasonOf(err))
		return
	}
	if !d.pkeyInTable(hca.PKey(p.BTH.PKey)) {
		d.ctr.drop(wire.DropBadPKey)
		return
	}
	if from.Port() == d.local.Port() {
		d.addMember(from.Addr())
	}
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
		case !pkeyMatch(hca.PKey(p.BTH.PKey), q.pkey):
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

// pkeyMatch is the IBTA P_Key rule: the low 15 bits equal and at least one
// side a full member.
func pkeyMatch(a, b hca.PKey) bool {
	return a&0x7FFF == b&0x7FFF && (a|b)&0x8000 != 0
}

func (d *Device) pkeyInTable(k hca.PKey) bool {
	for _, e := range d.cfg.PKeys {
		if pkeyMatch(k, e) {
			return true
		}
	}
	return false
}
