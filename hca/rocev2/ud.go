package rocev2

import (
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// qkeyUseOwn: a send Q_Key with the high bit set means "use the QP's own
// Q_Key" (IBTA 10.2.5), which is how the GSI QP sends 0x80010000.
const qkeyUseOwn = 0x80000000

// postSendUD sends each datagram at once; UD completes on transmit. mu held.
func (q *qp) postSendUD(wrs []hca.SendWR) (int, error) {
	d := q.dev
	for i := range wrs {
		wr := &wrs[i]
		a, ok := wr.AH.(*ah)
		if !ok {
			q.completeSend(wr.ID, hca.StatusLocLenErr, 0)
			continue
		}
		if len(wr.Data) > int(d.cfg.MTU) {
			q.completeSend(wr.ID, hca.StatusLocLenErr, 0)
			continue
		}
		qkey := wr.RemoteQKey
		if qkey&qkeyUseOwn != 0 {
			qkey = q.qkey
		}
		spec := wire.PacketSpec{
			BTH:  wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(q.pkey), DestQP: uint32(wr.RemoteQPN & hca.QPNMask), PSN: q.udPSN},
			DETH: wire.DETH{QKey: uint32(qkey), SrcQP: uint32(q.qpn)},
		}
		q.udPSN = psnAdd(q.udPSN, 1)
		if wr.RemoteQPN == hca.QPNMulticast && a.dgid.IsMulticast() {
			// Head-end replication: one unicast copy per member, self
			// included, so local QPs attached to the group get theirs
			// through the same receive path.
			for _, m := range d.members {
				q.sendDatagram(&spec, wr.Data, m)
			}
		} else {
			q.sendDatagram(&spec, wr.Data, a.dgid.Addr())
		}
		q.completeSend(wr.ID, hca.StatusSuccess, len(wr.Data))
	}
	return len(wrs), nil
}

func (q *qp) sendDatagram(spec *wire.PacketSpec, data []byte, to netip.Addr) {
	d := q.dev
	buf := d.getBuf()
	h := wire.EncodeHeaders(buf, spec, len(data))
	copy(buf[h:], data)
	pad := int(wire.PadCount(len(data)))
	clear(buf[h+len(data) : h+len(data)+pad])
	d.queuePacket(q.src, to, buf[:h+len(data)+pad+wire.ICRCLen])
}

// recvUD delivers a UD packet to its QP, or for DestQP 0xFFFFFF to every
// local QP attached to a group with the packet's Q_Key. mu held.
func (d *Device) recvUD(p *wire.Packet, from netip.Addr) {
	if len(p.Payload) > int(d.cfg.MTU) {
		d.ctr.drop(wire.DropBadLength)
		return
	}
	info := udInfo{srcQPN: hca.QPN(p.DETH.SrcQP), srcGID: hca.GIDFromAddr(from), pkey: hca.PKey(p.BTH.PKey)}
	if hca.QPN(p.BTH.DestQP) == hca.QPNMulticast {
		delivered := false
		for _, q := range d.qps {
			if len(q.mcast) == 0 || uint32(q.qkey) != p.DETH.QKey || q.state < hca.QPStateRTR || q.state == hca.QPStateError ||
				!info.pkey.Matches(q.pkey) {
				continue
			}
			delivered = true
			q.deliverUD(p, &info)
		}
		if !delivered {
			d.ctr.drop(wire.DropUnknownQP)
		}
		return
	}
	q := d.qps[hca.QPN(p.BTH.DestQP)]
	switch {
	case q == nil:
		d.ctr.drop(wire.DropUnknownQP)
	case q.typ == hca.QPTypeRC || q.state < hca.QPStateRTR || q.state == hca.QPStateError:
		d.ctr.drop(wire.DropWrongState)
	case q.typ != hca.QPTypeGSI && !info.pkey.Matches(q.pkey):
		d.ctr.drop(wire.DropBadPKey)
	case uint32(q.qkey) != p.DETH.QKey:
		d.ctr.drop(wire.DropBadQKey)
	default:
		q.deliverUD(p, &info)
	}
}

func (q *qp) deliverUD(p *wire.Packet, info *udInfo) {
	wr, ok := q.takeRecv()
	if !ok {
		q.dev.ctr.drop(wire.DropNoBuffer)
		return
	}
	if len(p.Payload) > len(wr.Buf) {
		q.completeRecv(wr.ID, hca.StatusLocLenErr, len(p.Payload), info)
		return
	}
	copy(wr.Buf, p.Payload)
	q.completeRecv(wr.ID, hca.StatusSuccess, len(p.Payload), info)
}
