package soak

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/mutation"
)

// verbsWatch stands between one Interface and its device and checks the
// dead-flag invariant from outside the engine, through the verbs contract
// and the host port alone: once the consumer has started to move a QP to
// Error, no receive completion of that QP polled by a Poll that began
// afterwards may reach the host. The watch learns which buffer each
// receive work request posted (PostRecv on the SRQ or the QP), notes the
// doomed completions a Poll returns, and the soak host reports every frame
// the engine writes (delivered): a frame in a doomed completion's buffer
// is the violation. A doomed completion still undelivered when the poller
// comes back for more (Poll or Notify) was recycled, as it must be.
//
// The engine marks the connection dead under the poll lock before it
// calls Modify(Error), so no correct poll can miss the flag: an epoch
// taken when the Modify begins and one taken when a Poll begins order
// the two without a false alarm. The engine hands the host received
// frames in place, in the receive buffer, before it reposts the buffer,
// so a delivered frame is recognised by the buffer it lies in.
type verbsWatch struct {
	host  int
	viol  *soakViolations
	mut   mutation.Soak
	epoch atomic.Uint64

	mu sync.Mutex
	// doomed maps a QP's context to the epoch its consumer began moving
	// it to Error; forgotten when the QP is destroyed.
	doomed map[any]uint64
	// srqBufs and ringBufs name the buffer (by the last byte of its
	// array) each posted receive work request fills: SRQ work requests
	// by id, a QP's own ring by QP context and id.
	srqBufs  map[uint64]*byte
	ringBufs map[doomKey]*byte
	// pending are doomed receive completions of the last Poll, by buffer,
	// with the CQ that returned them.
	pending map[*byte]pendingDoom

	checked  atomic.Uint64 // doomed completions seen recycled
	violated atomic.Uint64 // doomed completions delivered
}

type doomKey struct {
	ctx any
	id  uint64
}

type pendingDoom struct {
	cq *watchedCQ
	id uint64
}

func newVerbsWatch(host int, viol *soakViolations, mut mutation.Soak) *verbsWatch {
	return &verbsWatch{
		host: host, viol: viol, mut: mut,
		doomed:   make(map[any]uint64),
		srqBufs:  make(map[uint64]*byte),
		ringBufs: make(map[doomKey]*byte),
		pending:  make(map[*byte]pendingDoom),
	}
}

// wrap returns dev with its CQs, QPs and SRQs watched.
func (w *verbsWatch) wrap(dev hca.Device) hca.Device { return &watchedDevice{Device: dev, w: w} }

// bufEnd names a buffer by the last byte of its array: a receive work
// request's Buf and the frame the engine writes from the same buffer
// (which starts in the headroom before Buf) share it.
func bufEnd(b []byte) *byte {
	if cap(b) == 0 {
		return nil
	}
	return &b[:cap(b)][cap(b)-1]
}

func (w *verbsWatch) posted(ctx any, srq bool, wrs []hca.RecvWR) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range wrs {
		if srq {
			w.srqBufs[wrs[k].ID] = bufEnd(wrs[k].Buf)
		} else {
			w.ringBufs[doomKey{ctx, wrs[k].ID}] = bufEnd(wrs[k].Buf)
		}
	}
}

// delivered is the soak host's report of frames the engine wrote to it.
func (w *verbsWatch) delivered(frames [][]byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) == 0 {
		return
	}
	for _, f := range frames {
		end := bufEnd(f)
		p, ok := w.pending[end]
		if !ok {
			continue
		}
		delete(w.pending, end)
		w.violated.Add(1)
		w.viol.record(violDeadDelivered, fmt.Sprintf("host %d: receive completion (wr %#x) of a QP moved to Error before the poll was delivered", w.host, p.id))
	}
}

// settle runs when cq's poller comes back for more (Poll or Notify): the
// previous batch has been handled and its frames written, so anything
// doomed in it and not delivered was recycled.
func (w *verbsWatch) settle(cq *watchedCQ) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for end, p := range w.pending {
		if p.cq == cq {
			delete(w.pending, end)
			w.checked.Add(1)
		}
	}
}

// note records the doomed receive completions among wcs, returned by a
// Poll that began at epoch start.
func (w *verbsWatch) note(cq *watchedCQ, wcs []hca.WC, start uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.doomed) == 0 {
		return
	}
	for k := range wcs {
		wc := &wcs[k]
		if wc.Opcode != hca.WCRecv {
			continue
		}
		e, ok := w.doomed[wc.Context]
		if !ok || e > start {
			continue
		}
		end, ok := w.ringBufs[doomKey{wc.Context, wc.ID}]
		if !ok {
			end, ok = w.srqBufs[wc.ID]
		}
		if ok && end != nil {
			w.pending[end] = pendingDoom{cq: cq, id: wc.ID}
		}
	}
}

func (w *verbsWatch) doom(ctx any) {
	w.mu.Lock()
	if _, ok := w.doomed[ctx]; !ok {
		w.doomed[ctx] = w.epoch.Add(1)
	}
	w.mu.Unlock()
}

func (w *verbsWatch) forget(ctx any) {
	w.mu.Lock()
	delete(w.doomed, ctx)
	for k := range w.ringBufs {
		if k.ctx == ctx {
			delete(w.ringBufs, k)
		}
	}
	w.mu.Unlock()
}

// watchedDevice wraps CQs, QPs and SRQs; everything else passes through.
// It carries the run's mutations to the engine (mutation.Carrier).
type watchedDevice struct {
	hca.Device
	w *verbsWatch
}

func (d *watchedDevice) SoakMutations() mutation.Soak { return d.w.mut }

func (d *watchedDevice) CreateCQ(cfg hca.CQConfig) (hca.CQ, error) {
	c, err := d.Device.CreateCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &watchedCQ{CQ: c, w: d.w}, nil
}

func (d *watchedDevice) CreateSRQ(cfg hca.SRQConfig) (hca.SRQ, error) {
	s, err := d.Device.CreateSRQ(cfg)
	if err != nil {
		return nil, err
	}
	return &watchedSRQ{SRQ: s, w: d.w}, nil
}

func (d *watchedDevice) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	cfg.SendCQ = unwrapCQ(cfg.SendCQ)
	cfg.RecvCQ = unwrapCQ(cfg.RecvCQ)
	if s, ok := cfg.SRQ.(*watchedSRQ); ok {
		cfg.SRQ = s.SRQ
	}
	q, err := d.Device.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	return &watchedQP{QP: q, w: d.w, ctx: cfg.Context}, nil
}

func unwrapCQ(c hca.CQ) hca.CQ {
	if wc, ok := c.(*watchedCQ); ok {
		return wc.CQ
	}
	return c
}

type watchedCQ struct {
	hca.CQ
	w *verbsWatch
}

func (c *watchedCQ) Poll(into []hca.WC) int {
	c.w.settle(c)
	start := c.w.epoch.Load()
	n := c.CQ.Poll(into)
	if n > 0 {
		c.w.note(c, into[:n], start)
	}
	return n
}

func (c *watchedCQ) Notify(reportMissed bool) bool {
	c.w.settle(c)
	return c.CQ.Notify(reportMissed)
}

type watchedSRQ struct {
	hca.SRQ
	w *verbsWatch
}

func (s *watchedSRQ) PostRecv(wrs []hca.RecvWR) (int, error) {
	s.w.posted(nil, true, wrs)
	return s.SRQ.PostRecv(wrs)
}

type watchedQP struct {
	hca.QP
	w   *verbsWatch
	ctx any
}

func (q *watchedQP) PostRecv(wrs []hca.RecvWR) (int, error) {
	q.w.posted(q.ctx, false, wrs)
	return q.QP.PostRecv(wrs)
}

func (q *watchedQP) Modify(attr hca.QPAttr) error {
	if attr.State == hca.QPStateError {
		q.w.doom(q.ctx)
	}
	return q.QP.Modify(attr)
}

func (q *watchedQP) Destroy() error {
	q.w.forget(q.ctx)
	return q.QP.Destroy()
}
