package rocev2

import (
	"fmt"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

const (
	psnMask = wire.PSNMask
	// maxUnacked is the requester's window in packets. rxe uses 128
	// (RXE_MAX_UNACKED_PSNS), but a userspace ACK round trip through two
	// processes is far longer than a NIC's: at 128 (8 IPoIB-CM messages)
	// the window, not the CPU, capped throughput. 256 measured as fast as
	// 512 without loss and go-back-N resends less when a datagram is
	// lost.
	maxUnacked = 256
	// ackReqEvery sets the AckReq bit at least every this many packets of
	// a long message, so the window keeps moving (rxe asks every 64).
	ackReqEvery = 32
)

func psnAdd(a uint32, n int) uint32 { return (a + uint32(n)) & psnMask }

// psnDiff returns a-b as a signed 24-bit distance, correct across wrap.
func psnDiff(a, b uint32) int { return int(int32((a-b)<<8) >> 8) }

func (q *qp) postSendRC(wrs []hca.SendWR) (int, error) {
	for i := range wrs {
		if len(wrs[i].Data) > maxMsgSize {
			return i, fmt.Errorf("rocev2: RC message of %d bytes: %w", len(wrs[i].Data), hca.ErrInvalidArgument)
		}
		if err := q.checkSendOffload(&wrs[i]); err != nil {
			return i, err
		}
		if q.sqLen == len(q.sq) {
			if i == 0 {
				return 0, fmt.Errorf("rocev2: post send QP %#x: %w", q.qpn, hca.ErrQueueFull)
			}
			q.pump()
			return i, fmt.Errorf("rocev2: post send %d of %d: %w", i, len(wrs), hca.ErrQueueFull)
		}
		fillRCChecksums(&wrs[i])
		n := max(1, (len(wrs[i].Data)+q.mtu-1)/q.mtu)
		q.sq[(q.sqHead+q.sqLen)%len(q.sq)] = sendWQE{id: wrs[i].ID, data: wrs[i].Data, firstPSN: q.nextPSN, npkts: uint32(n)}
		q.sqLen++
		q.nextPSN = psnAdd(q.nextPSN, n)
	}
	q.pump()
	return len(wrs), nil
}

func (q *qp) popSend() {
	q.sq[q.sqHead] = sendWQE{}
	q.sqHead = (q.sqHead + 1) % len(q.sq)
	q.sqLen--
}

// pump transmits packets from txPSN while the window allows and no RNR
// wait is pending. mu held.
func (q *qp) pump() {
	d := q.dev
	for q.state == hca.QPStateRTS && q.timer != timerRNR && q.txIdx < q.sqLen && psnDiff(q.txPSN, q.una) < maxUnacked {
		w := &q.sq[(q.sqHead+q.txIdx)%len(q.sq)]
		n := min(q.mtu, len(w.data)-q.txOff)
		first, last := q.txOff == 0, q.txOff+n == len(w.data)
		var op wire.Opcode
		switch {
		case first && last:
			op = wire.OpRCSendOnly
		case first:
			op = wire.OpRCSendFirst
		case last:
			op = wire.OpRCSendLast
		default:
			op = wire.OpRCSendMiddle
		}
		ackReq := last || psnDiff(q.txPSN, w.firstPSN)%ackReqEvery == ackReqEvery-1
		buf := d.getBuf()
		spec := wire.PacketSpec{BTH: wire.BTH{Opcode: op, PKey: uint16(q.pkey()), DestQP: uint32(q.destQPN), AckReq: ackReq, PSN: q.txPSN}}
		h := wire.EncodeHeaders(buf, &spec, n)
		payload := w.data[q.txOff : q.txOff+n]
		if n < zeroCopyMin {
			copy(buf[h:], payload)
			pad := int(wire.PadCount(n))
			clear(buf[h+n : h+n+pad])
			d.queuePacket(q.src, q.dest, buf[:h+n+pad+wire.ICRCLen])
		} else if gen := d.queueZeroCopy(q.src, q.dest, buf, h, payload); gen > 0 {
			// The payload stays in the WQE's buffer until the socket took
			// it: the WQE's completion waits for this batch.
			w.zcGen, q.zcGen = gen, gen
		}
		if psnDiff(q.txPSN, q.sentEnd) < 0 {
			d.ctr.retransmits.Add(1)
			q.retransmits++
		}
		q.txPSN = psnAdd(q.txPSN, 1)
		if psnDiff(q.txPSN, q.sentEnd) > 0 {
			q.sentEnd = q.txPSN
		}
		if last {
			q.txIdx++
			q.txOff = 0
		} else {
			q.txOff += n
		}
		if q.timer == timerNone && q.timeout > 0 {
			q.armTimer(timerRetry, q.timeout)
		}
	}
}

// rewind points the transmitter at psn (go-back-N). mu held.
func (q *qp) rewind(psn uint32) {
	q.txPSN = psn
	for i := 0; i < q.sqLen; i++ {
		w := &q.sq[(q.sqHead+i)%len(q.sq)]
		if off := psnDiff(psn, w.firstPSN); off >= 0 && off < int(w.npkts) {
			q.txIdx, q.txOff = i, off*q.mtu
			return
		}
	}
	q.txIdx, q.txOff = q.sqLen, 0
}

// ackThrough records that every PSN before una is acknowledged and
// completes the WQEs it covers; it reports whether that was progress.
func (q *qp) ackThrough(una uint32) bool {
	if psnDiff(una, q.una) <= 0 || psnDiff(una, q.sentEnd) > 0 {
		return false
	}
	q.una = una
	done := 0
	for q.sqLen > 0 {
		w := &q.sq[q.sqHead]
		if psnDiff(psnAdd(w.firstPSN, int(w.npkts)), una) > 0 {
			break
		}
		q.completeSendAfter(w.id, hca.StatusSuccess, len(w.data), w.zcGen)
		q.popSend()
		done++
	}
	if psnDiff(q.txPSN, q.una) < 0 {
		q.rewind(q.una)
	} else {
		q.txIdx -= done
	}
	q.retryLeft, q.rnrLeft = q.retryCount, q.rnrRetry
	if q.timer == timerRetry {
		if q.una == q.sentEnd {
			q.disarmTimer()
		} else if q.timeout > 0 {
			q.armTimer(timerRetry, q.timeout)
		}
	}
	return true
}

// fail completes the head WQE with st and moves the QP to Error, which
// flushes the rest behind it.
func (q *qp) fail(st hca.Status) {
	if q.sqLen > 0 {
		w := &q.sq[q.sqHead]
		q.completeSendAfter(w.id, st, 0, w.zcGen)
		q.popSend()
	}
	q.toError()
}

// retryTimeout handles the transport timer: go back to the oldest
// unacknowledged PSN, or fail with RETRY_EXC_ERR when retries ran out.
func (q *qp) retryTimeout() {
	if q.una == q.sentEnd {
		return
	}
	q.dev.ctr.timeouts.Add(1)
	if !q.useRetry() {
		q.fail(hca.StatusRetryExcErr)
		return
	}
	q.rewind(q.una)
	q.pump()
}

// useRetry spends one transport retry; 7 means retry forever.
func (q *qp) useRetry() bool {
	if q.retryCount == 7 {
		return true
	}
	if q.retryLeft == 0 {
		return false
	}
	q.retryLeft--
	return true
}

// recvAck handles an RC ACKNOWLEDGE for a requester QP. mu held.
func (q *qp) recvAck(p *wire.Packet) {
	if q.state != hca.QPStateRTS {
		q.dev.ctr.drop(wire.DropWrongState)
		return
	}
	psn := p.BTH.PSN
	switch syn := p.AETH.Syndrome; syn.Kind() {
	case wire.KindACK:
		if q.ackThrough(psnAdd(psn, 1)) {
			q.pump()
		}
	case wire.KindRNRNAK:
		q.dev.ctr.rnrNAKsReceived.Add(1)
		q.ackThrough(psn)
		if psn != q.una {
			return // stale NAK for a PSN already acknowledged
		}
		if q.rnrRetry != 7 {
			if q.rnrLeft == 0 {
				q.fail(hca.StatusRNRRetryExcErr)
				return
			}
			q.rnrLeft--
		}
		q.rewind(psn)
		q.armTimer(timerRNR, q.dev.cfg.scale(RNRTimer(syn.Value())))
	case wire.KindNAK:
		q.ackThrough(psn)
		if psn != q.una {
			return
		}
		switch syn {
		case wire.SyndromeNAKSeqErr:
			q.dev.ctr.seqNAKsReceived.Add(1)
			if q.timer == timerRNR {
				return // already going back to this PSN after the RNR wait
			}
			// rxe counts a sequence NAK against the retry count.
			if !q.useRetry() {
				q.fail(hca.StatusRetryExcErr)
				return
			}
			q.rewind(psn)
			q.pump()
		case wire.SyndromeNAKInvReq:
			q.fail(hca.StatusRemInvReqErr)
		default:
			q.fail(hca.StatusRemOpErr)
		}
	default:
		q.dev.ctr.drop(wire.DropGarbage)
	}
}

// sendAck queues an ACK or NAK to the requester of responder QP q.
func (q *qp) sendAck(syn wire.Syndrome, psn uint32) {
	d := q.dev
	buf := d.getBuf()
	spec := wire.PacketSpec{
		BTH:  wire.BTH{Opcode: wire.OpRCAck, PKey: uint16(q.pkey()), DestQP: uint32(q.destQPN), PSN: psn},
		AETH: wire.AETH{Syndrome: syn, MSN: q.msn},
	}
	h := wire.EncodeHeaders(buf, &spec, 0)
	d.queuePacket(q.src, q.dest, buf[:h+wire.ICRCLen])
	switch syn.Kind() {
	case wire.KindACK:
		d.ctr.acksSent.Add(1)
	case wire.KindRNRNAK:
		d.ctr.rnrNAKsSent.Add(1)
	default:
		if syn == wire.SyndromeNAKSeqErr {
			d.ctr.seqNAKsSent.Add(1)
		}
	}
}

// scheduleAck coalesces ACKs: one per QP per received batch, for the
// newest PSN.
func (q *qp) scheduleAck(psn uint32) {
	q.ackPSN = psn
	if !q.ackPending {
		q.ackPending = true
		q.dev.ackQPs = append(q.dev.ackQPs, q)
	}
}

// recvRequest is the responder: it handles an RC SEND packet. mu held.
func (q *qp) recvRequest(p *wire.Packet, from netip.Addr) {
	d := q.dev
	if q.state != hca.QPStateRTR && q.state != hca.QPStateRTS || from != q.dest {
		d.ctr.drop(wire.DropWrongState)
		return
	}
	psn := p.BTH.PSN
	switch diff := psnDiff(psn, q.ePSN); {
	case diff > 0:
		// A gap: NAK once, then stay silent until the requester resends.
		if !q.nakSent {
			q.nakSent = true
			q.sendAck(wire.SyndromeNAKSeqErr, q.ePSN)
		}
		return
	case diff < 0:
		d.ctr.duplicates.Add(1)
		q.scheduleAck(psnAdd(q.ePSN, -1))
		return
	}
	op := p.BTH.Opcode
	if op.StartsMessage() == q.inMsg || len(p.Payload) > q.mtu || !op.EndsMessage() && len(p.Payload) != q.mtu {
		// Opcode out of sequence or a malformed segment: invalid request.
		q.sendAck(wire.SyndromeNAKInvReq, psn)
		q.toError()
		return
	}
	if op.StartsMessage() {
		wr, ok := q.takeRecv()
		if !ok {
			q.sendAck(wire.RNRNAK(q.minRNR), psn)
			// The packets behind this one are a gap now; the RNR NAK
			// already tells the requester where to resume, so a sequence
			// NAK must not follow (it would spend a transport retry).
			q.nakSent = true
			return
		}
		q.cur, q.curValid, q.curOff, q.inMsg = wr, true, 0, true
	}
	if q.curOff+len(p.Payload) > len(q.cur.Buf) {
		q.completeRecv(q.cur.ID, hca.StatusLocLenErr, q.curOff, nil)
		q.curValid = false
		q.sendAck(wire.SyndromeNAKInvReq, psn)
		q.toError()
		return
	}
	copy(q.cur.Buf[q.curOff:], p.Payload)
	q.curOff += len(p.Payload)
	q.ePSN = psnAdd(q.ePSN, 1)
	q.nakSent = false
	if op.EndsMessage() {
		q.msn = (q.msn + 1) & psnMask
		q.dev.ctr.rcMessages.Add(1)
		q.completeRecv(q.cur.ID, hca.StatusSuccess, q.curOff, nil)
		q.cur, q.curValid, q.inMsg = hca.RecvWR{}, false, false
	}
	if p.BTH.AckReq {
		q.scheduleAck(psn)
	}
}
