package soft

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
)

// udSend is one UD send on its way: the request and what the offloads
// made of it.
type udSend struct {
	wr *hca.SendWR
	// lso and segments describe an LSO send (segments 0 otherwise).
	lso      offload.Headers
	segments int
	// flags go on every receive completion of the send.
	flags hca.WCFlags
	// mgid is the group of a multicast send (zero otherwise), counted per
	// receiving device (Device.McastStats).
	mgid hca.GID
}

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
	u := udSend{wr: wr, flags: csumPartial(wr)}
	if wr.MSS > 0 {
		var err error
		if u.lso, err = f.offloads().PrepareLSO(wr, f.cfg.MTU); err != nil {
			return fmt.Errorf("send WR %d: %w", wr.ID, err)
		}
		u.segments = u.lso.Segments(wr.MSS)
	} else if wr.Flags&hca.SendIPCsum != 0 && !f.offloads().IPCsum {
		return fmt.Errorf("send WR %d: IP checksum offload: %w", wr.ID, hca.ErrNotSupported)
	}
	if !s.dev.linkUp {
		f.stats.udLinkDwn.Add(1)
		return nil
	}
	if wr.MSS == 0 && len(wr.Data) > int(f.cfg.MTU) {
		f.stats.udTooBig.Add(1)
		return nil
	}
	pkey := s.pkey()
	if s.typ == hca.QPTypeGSI {
		// QP 1 serves every partition: each MAD names its P_Key index.
		if wr.PKeyIndex < 0 || wr.PKeyIndex >= len(s.dev.pkeys) {
			return fmt.Errorf("send WR %d: P_Key index %d of %d: %w", wr.ID, wr.PKeyIndex, len(s.dev.pkeys), hca.ErrInvalidArgument)
		}
		pkey = s.dev.pkeys[wr.PKeyIndex]
	}
	if f.cfg.Tap != nil {
		f.tapUD(s, wr, a.dgid, pkey)
	}
	if wr.RemoteQPN&hca.QPNMask == hca.QPNMulticast {
		members := f.groups[a.dgid]
		if !a.dgid.IsMulticast() || len(members) == 0 {
			f.stats.udNoQP.Add(1)
			return nil
		}
		u.mgid = a.dgid
		for _, r := range members {
			f.deliverUD(s, r, &u, pkey)
		}
		return nil
	}
	var r *qp
	if d := f.devices[a.dgid]; d != nil {
		r = d.qps[wr.RemoteQPN&hca.QPNMask]
	}
	f.deliverUD(s, r, &u, pkey)
	return nil
}

// deliverUD delivers u to r: one message, or for LSO one message per
// segment, each dropped or delivered on its own as the HCA's packets are.
func (f *Fabric) deliverUD(s, r *qp, u *udSend, pkey hca.PKey) {
	if u.segments == 0 {
		f.deliverUDOne(s, r, u, pkey, -1)
		return
	}
	for i := range u.segments {
		f.deliverUDOne(s, r, u, pkey, i)
	}
}

// deliverUDOne copies u's message (seg < 0) or its LSO segment seg into
// r's next receive buffer if r accepts it.
func (f *Fabric) deliverUDOne(s, r *qp, u *udSend, pkey hca.PKey, seg int) {
	wr := u.wr
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
	case !r.acceptsPKey(pkey):
		f.stats.udPKey.Add(1)
		r.dev.pkeyViolations.Add(1)
		return
	case f.chance(f.faults.UDLoss):
		f.stats.udLoss.Add(1)
		return
	}
	buf, ok := f.takeRecv(r)
	if !ok {
		f.stats.udNoBuffer.Add(1)
		r.dev.udNoBuffer.Add(1)
		return
	}
	wc := r.recvWC(buf.ID, hca.StatusSuccess, len(wr.Data))
	wc.SrcQPN, wc.SrcGID, wc.PKey, wc.Flags = s.qpn, s.dev.gid, pkey, u.flags
	if seg >= 0 {
		// The fabric is memory, not a wire: segments keep the partial
		// checksum the sender left, as veth keeps CHECKSUM_PARTIAL.
		n, err := u.lso.SegmentInto(buf.Buf, wr.Data, wr.MSS, seg, false)
		if err != nil {
			wc.Status, wc.ByteLen, wc.Flags = hca.StatusLocLenErr, 0, 0
		} else {
			wc.ByteLen = n
			f.stats.udMessages.Add(1)
			f.stats.udLSOSegments.Add(1)
		}
	} else if len(wr.Data) > len(buf.Buf) {
		wc.Status, wc.ByteLen, wc.Flags = hca.StatusLocLenErr, 0, 0
	} else {
		copy(buf.Buf, wr.Data)
		f.stats.udMessages.Add(1)
	}
	if wc.Status == hca.StatusSuccess && u.mgid.IsMulticast() {
		r.dev.mcast.delivered(u.mgid)
	}
	f.complete(r.recvCQ, r, wc)
}
