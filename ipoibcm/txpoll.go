package ipoibcm

import "github.com/ipoibcm/ipoib/hca"

// handleTX is the TX poller's Handle: send completions of the UD QP and of
// every active connection give back their pool buffer and their credit.
// A send error other than a flush tears the connection down; the next
// frame reconnects (Linux ipoib_cm_handle_tx_wc).
func (i *Interface) handleTX(wcs []hca.WC) {
	credits := 0
	free := i.txFree[:0]
	for k := range wcs {
		wc := &wcs[k]
		if wrKind(wc.ID) != wrKindSend {
			continue
		}
		idx := wrIndex(wc.ID)
		if idx >= len(i.pool.bufs) {
			continue
		}
		free = append(free, idx)
		ok := wc.Status == hca.StatusSuccess
		if ok {
			i.ctr.txPackets.Add(1)
			i.ctr.txBytes.Add(uint64(i.pool.lens[idx]))
		} else if wc.Status != hca.StatusWRFlushErr {
			i.ctr.txErrors.Add(1)
			i.ctr.drop(dropTxSendError)
		}
		switch ctx := wc.Context.(type) {
		case *udQP:
			credits++
		case *txConn:
			if i.txSendDone(ctx) {
				credits++
			}
			if !ok {
				if wc.Status == hca.StatusWRFlushErr {
					i.ctr.drop(dropTxNeighFlushed)
				} else {
					i.txConnFailed(ctx)
				}
			}
		default:
			credits++
		}
	}
	i.pool.put(free...)
	i.txFree = free[:0]
	i.returnCredits(credits)
}
