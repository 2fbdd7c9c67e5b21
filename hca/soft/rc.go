package soft

import (
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// rcResult is the outcome of one attempt to deliver an RC message.
//
//go:generate go tool stringer -type=rcResult -linecomment
type rcResult int

const (
	rcDelivered rcResult = iota // delivered
	// rcNoBuffer: the responder had no receive buffer (RNR NAK).
	rcNoBuffer // no-buffer
	// rcInjectedRNR: Faults.RNR pretended there was no buffer.
	rcInjectedRNR // injected-rnr
	// rcUnreachable: no responder answered (missing, not ready, in Error,
	// connected elsewhere, partition mismatch, link down).
	rcUnreachable // unreachable
	// rcRemoteTooLong: the message did not fit the receive buffer.
	rcRemoteTooLong // remote-too-long
	// rcLocalTooLong: the message exceeds the device's MaxMsgSize.
	rcLocalTooLong // local-too-long
)

// progressSends works through s's send queue until it is empty or the head
// must wait; under f.mu.
func (f *Fabric) progressSends(s *qp) {
	for s.state == hca.QPStateRTS && s.sendState == sendReady && s.sq.Len() > 0 {
		wr := s.sq.Peek()
		res, r := f.deliverRC(s, wr)
		switch res {
		case rcDelivered:
			id, n := wr.ID, len(wr.Data)
			s.sq.Pop()
			s.rnrLeft, s.retryLeft = int(s.rnrRetry), int(s.retryCount)
			f.complete(s.sendCQ, s, s.sendWC(id, hca.StatusSuccess, n))
		case rcNoBuffer, rcInjectedRNR:
			f.stats.rnrNaks.Add(1)
			if f.cfg.Tap != nil && r != nil {
				f.tapRC(MessageRNRNak, s, r, nil)
			}
			f.rnrNak(s, r, res == rcInjectedRNR)
		case rcUnreachable:
			f.transportRetry(s)
		case rcRemoteTooLong:
			f.failHead(s, hca.StatusRemInvReqErr)
			if r != s {
				f.toError(r)
			}
		case rcLocalTooLong:
			f.failHead(s, hca.StatusLocLenErr)
		}
	}
}

// failHead completes s's head send with st and moves s to Error, which
// flushes the sends behind it.
func (f *Fabric) failHead(s *qp, st hca.Status) {
	wr, _ := s.sq.Pop()
	f.complete(s.sendCQ, s, s.sendWC(wr.ID, st, 0))
	f.toError(s)
}

// peerOf finds s's connected responder, caching the lookup.
func (f *Fabric) peerOf(s *qp) *qp {
	if r := s.peer; r != nil && !r.destroyed.Load() && r.qpn == s.destQPN {
		return r
	}
	s.peer = nil
	if d := f.devices[s.destGID]; d != nil {
		s.peer = d.qps[s.destQPN]
	}
	return s.peer
}

// deliverRC tries to place wr in the responder's next receive buffer.
func (f *Fabric) deliverRC(s *qp, wr *hca.SendWR) (rcResult, *qp) {
	if len(wr.Data) > maxMsgSize {
		return rcLocalTooLong, nil
	}
	r := f.peerOf(s)
	if r == nil || r.destroyed.Load() || !s.dev.linkUp || !r.dev.linkUp || r.typ != hca.QPTypeRC ||
		(r.state != hca.QPStateRTR && r.state != hca.QPStateRTS) ||
		r.destQPN != s.qpn || r.destGID != s.dev.gid {
		return rcUnreachable, r
	}
	if !r.acceptsPKey(s.pkey()) {
		// The responder drops the packet unanswered; the requester
		// retries it until its retry count is spent, every copy one
		// more violation at the responder's port.
		r.dev.pkeyViolations.Add(1)
		return rcUnreachable, r
	}
	if f.chance(f.faults.RNR) {
		return rcInjectedRNR, r
	}
	buf, ok := f.takeRecv(r)
	if !ok {
		return rcNoBuffer, r
	}
	if len(wr.Data) > len(buf.Buf) {
		f.complete(r.recvCQ, r, r.recvWC(buf.ID, hca.StatusLocLenErr, 0))
		return rcRemoteTooLong, r
	}
	n := copy(buf.Buf, wr.Data)
	wc := r.recvWC(buf.ID, hca.StatusSuccess, n)
	wc.Flags = csumPartial(wr)
	f.complete(r.recvCQ, r, wc)
	f.stats.rcMessages.Add(1)
	if f.cfg.Tap != nil {
		f.tapRC(MessageRC, s, r, wr.Data)
	}
	return rcDelivered, r
}

// rnrNak handles an RNR NAK from responder r: retry after r's RNR timer,
// park until a buffer is posted (RNR retry 7), or fail the send.
func (f *Fabric) rnrNak(s, r *qp, injected bool) {
	if s.rnrRetry == 7 {
		if injected {
			// The buffer may already be there; a post might never come.
			f.retryAfter(s, sendRNRWait, f.cfg.rnrDelay(r.minRNR))
			return
		}
		s.sendState = sendBufferWait
		rq := r.recvQueue()
		s.waitingOn = rq
		rq.waiters = append(rq.waiters, s)
		return
	}
	if s.rnrLeft == 0 {
		f.failHead(s, hca.StatusRNRRetryExcErr)
		return
	}
	s.rnrLeft--
	f.retryAfter(s, sendRNRWait, f.cfg.rnrDelay(r.minRNR))
}

// transportRetry handles a request nobody answered: retransmit after the
// timeout until RetryCount is used up, then fail with RETRY_EXC_ERR.
func (f *Fabric) transportRetry(s *qp) {
	if s.retryLeft == 0 {
		f.failHead(s, hca.StatusRetryExcErr)
		return
	}
	s.retryLeft--
	f.stats.retries.Add(1)
	f.retryAfter(s, sendRetryWait, f.cfg.transportTimeout(s.timeout))
}

// retryAfter puts s in wait and resumes it after d unless something
// (Error, Reset, destroy) bumped its generation meanwhile.
func (f *Fabric) retryAfter(s *qp, wait sendState, d time.Duration) {
	s.sendState = wait
	gen := s.gen
	f.sched.after(d, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if s.destroyed.Load() || s.gen != gen || s.sendState != wait {
			return
		}
		s.sendState = sendReady
		f.progressSends(s)
	})
}
