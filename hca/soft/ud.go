package soft

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// sendUD delivers one UD send to its destination QP, or to every QP
// attached to the multicast group (the sender's own included), counting
// each drop by reason. UD is unreliable: drops still complete the send
// successfully. Only a malformed request returns an error.
func (f *Fabric) sendUD(s *qp, wr *hca.SendWR) error {
	a, ok := wr.AH.(*ah)
	if !ok || a == nil || a.dev.f != f {
		return fmt.Errorf("send WR %d: address handle missing or foreign: %w", wr.ID, hca.ErrInvalidArgument)
	}
	if a.destroyed {
		return fmt.Errorf("send WR %d: address handle: %w", wr.ID, hca.ErrDestroyed)
	}
	if !s.dev.linkUp {
		f.stats.udLinkDwn.Add(1)
		return nil
	}
	if len(wr.Data) > int(f.cfg.MTU) {
		f.stats.udTooBig.Add(1)
		return nil
	}
	pkey := s.pkey()
	if wr.RemoteQPN&hca.QPNMask == hca.QPNMulticast {
		members := f.groups[a.dgid]
		if !a.dgid.IsMulticast() || len(members) == 0 {
			f.stats.udNoQP.Add(1)
			return nil
		}
		for _, r := range members {
			f.deliverUD(s, r, wr, pkey)
		}
		return nil
	}
	var r *qp
	if d := f.devices[a.dgid]; d != nil {
		r = d.qps[wr.RemoteQPN&hca.QPNMask]
	}
	f.deliverUD(s, r, wr, pkey)
	return nil
}

// deliverUD copies wr into r's next receive buffer if r accepts it.
func (f *Fabric) deliverUD(s, r *qp, wr *hca.SendWR, pkey hca.PKey) {
	switch {
	case r == nil || r.typ == hca.QPTypeRC:
		f.stats.udNoQP.Add(1)
		return
	case !r.dev.linkUp:
		f.stats.udLinkDwn.Add(1)
		return
	case r.state != hca.QPStateRTR && r.state != hca.QPStateRTS:
		f.stats.udNoQP.Add(1)
		return
	case wr.RemoteQKey != r.qkey:
		f.stats.udQKey.Add(1)
		return
	case !pkey.Matches(r.pkey()):
		f.stats.udPKey.Add(1)
		return
	case f.chance(f.faults.UDLoss):
		f.stats.udLoss.Add(1)
		return
	}
	buf, ok := f.takeRecv(r)
	if !ok {
		f.stats.udNoBuffer.Add(1)
		return
	}
	wc := r.recvWC(buf.ID, hca.StatusSuccess, len(wr.Data))
	wc.SrcQPN, wc.SrcGID, wc.PKey = s.qpn, s.dev.gid, pkey
	if len(wr.Data) > len(buf.Buf) {
		wc.Status, wc.ByteLen = hca.StatusLocLenErr, 0
	} else {
		copy(buf.Buf, wr.Data)
		f.stats.udMessages.Add(1)
	}
	f.complete(r.recvCQ, r, wc)
}
