package rocev2

import (
	"fmt"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/offload"
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
		if err := q.checkSendOffload(wr); err != nil {
			return i, err
		}
		var lso offload.Headers
		if wr.MSS > 0 {
			var err error
			if lso, err = d.offloads().PrepareLSO(wr, d.cfg.MTU); err != nil {
				return i, fmt.Errorf("rocev2: send WR %d: %w", wr.ID, err)
			}
		} else if len(wr.Data) > int(d.cfg.MTU) {
			q.completeSend(wr.ID, hca.StatusLocLenErr, 0)
			continue
		}
		qkey := wr.RemoteQKey
		if qkey&qkeyUseOwn != 0 {
			qkey = q.qkey
		}
		pkey := q.pkey()
		if q.typ == hca.QPTypeGSI {
			// QP 1 serves every partition: each MAD names its P_Key
			// index (ib_ud_wr.pkey_index).
			if wr.PKeyIndex < 0 || wr.PKeyIndex >= len(d.pkeys) {
				return i, fmt.Errorf("rocev2: send WR %d: P_Key index %d of %d: %w", wr.ID, wr.PKeyIndex, len(d.pkeys), hca.ErrInvalidArgument)
			}
			pkey = d.pkeys[wr.PKeyIndex]
		}
		spec := wire.PacketSpec{
			BTH:  wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(pkey), DestQP: uint32(wr.RemoteQPN & hca.QPNMask), PSN: q.udPSN},
			DETH: wire.DETH{QKey: uint32(qkey), SrcQP: uint32(q.qpn)},
		}
		unicast := [1]netip.Addr{a.dgid.Addr()}
		to := unicast[:]
		if wr.RemoteQPN == hca.QPNMulticast && a.dgid.IsMulticast() {
			if d.cfg.Multicast {
				// The network replicates; IP_MULTICAST_LOOP brings the
				// copy for this host's attached QPs.
				unicast[0] = a.group
			} else {
				// Head-end replication: one unicast copy per member,
				// self included, so local QPs attached to the group get
				// theirs through the same receive path.
				to = d.members
			}
		}
		var gen uint64
		if wr.MSS > 0 {
			var err error
			if gen, err = q.sendLSO(&spec, wr, &lso, to); err != nil {
				return i, err
			}
		} else {
			q.udPSN = psnAdd(q.udPSN, 1)
			for _, m := range to {
				q.sendDatagram(&spec, wr, m)
			}
		}
		q.completeSendAfter(wr.ID, hca.StatusSuccess, len(wr.Data), gen)
	}
	return len(wrs), nil
}

// sendDatagram sends wr as one UD packet, its checksums filled in the
// packet (not the send buffer) when it asks for SendIPCsum.
func (q *qp) sendDatagram(spec *wire.PacketSpec, wr *hca.SendWR, to netip.Addr) {
	data := wr.Data
	buf := q.dev.getBuf()
	h := wire.EncodeHeaders(buf, spec, len(data))
	copy(buf[h:], data)
	if wr.Flags&hca.SendIPCsum != 0 {
		// A message that is no TCP/UDP packet goes as it is.
		_, _ = offload.FillChecksums(buf[h:h+len(data)], hca.OffloadL3Offset)
	}
	q.queueDatagram(buf, h, len(data), to)
}

// queueDatagram pads the n-byte payload behind the h header bytes in buf
// and queues the packet; the sender adds the ICRC.
func (q *qp) queueDatagram(buf []byte, h, n int, to netip.Addr) {
	pad := int(wire.PadCount(n))
	clear(buf[h+n : h+n+pad])
	q.dev.queuePacket(q.src, to, buf[:h+n+pad+wire.ICRCLen])
}

// recvUD delivers a UD packet to its QP, or for DestQP 0xFFFFFF to every
// local QP attached to a group with the packet's Q_Key. mu held.
func (d *Device) recvUD(p *wire.Packet, from netip.Addr) {
	if len(p.Payload) > int(d.cfg.MTU) {
		d.ctr.dropUD(wire.DropBadLength)
		return
	}
	if hca.QPN(p.BTH.DestQP) == hca.QPNGSI && d.gossip != nil && wire.IsMemberMAD(p.Payload) {
		d.receiveMemberMAD(p, from)
		return
	}
	info := udInfo{srcQPN: hca.QPN(p.DETH.SrcQP), srcGID: hca.GIDFromAddr(from), pkey: hca.PKey(p.BTH.PKey)}
	if hca.QPN(p.BTH.DestQP) == hca.QPNMulticast {
		delivered, otherPartition := false, false
		for _, q := range d.qps {
			if q.mcast.Len() == 0 || uint32(q.qkey) != p.DETH.QKey || q.state < hca.QPStateRTR || q.state == hca.QPStateError {
				continue
			}
			if !info.pkey.Matches(q.pkey()) {
				otherPartition = true
				continue
			}
			delivered = true
			q.deliverUD(p, &info)
		}
		switch {
		case delivered:
		case otherPartition:
			// The port is in the partition but no member QP is.
			d.ctr.dropUD(wire.DropBadPKey)
		default:
			d.ctr.dropUD(wire.DropUnknownQP)
		}
		return
	}
	q := d.qps[hca.QPN(p.BTH.DestQP)]
	switch {
	case q == nil:
		d.ctr.dropUD(wire.DropUnknownQP)
	case q.typ == hca.QPTypeRC || q.state < hca.QPStateRTR || q.state == hca.QPStateError:
		d.ctr.dropUD(wire.DropWrongState)
	case q.typ != hca.QPTypeGSI && !info.pkey.Matches(q.pkey()):
		d.ctr.dropUD(wire.DropBadPKey)
	case uint32(q.qkey) != p.DETH.QKey:
		d.ctr.dropUD(wire.DropBadQKey)
	default:
		q.deliverUD(p, &info)
	}
}

func (q *qp) deliverUD(p *wire.Packet, info *udInfo) {
	wr, ok := q.takeRecv()
	if !ok {
		q.dev.ctr.dropUD(wire.DropNoBuffer)
		return
	}
	if len(p.Payload) > len(wr.Buf) {
		q.completeRecv(wr.ID, hca.StatusLocLenErr, len(p.Payload), info)
		return
	}
	info.flags = 0
	if q.typ == hca.QPTypeUD { // CM MADs on the GSI QP are no IP packets
		if !info.csumDone {
			info.csum, info.csumDone = q.dev.rxCsumFlags(p.Payload), true
		}
		info.flags = info.csum
	}
	copy(wr.Buf, p.Payload)
	q.dev.ctr.udMessages.Add(1)
	q.completeRecv(wr.ID, hca.StatusSuccess, len(p.Payload), info)
}
