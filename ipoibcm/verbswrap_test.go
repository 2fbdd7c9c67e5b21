package ipoibcm

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/internal/mutation"
)

// wrapDevice is a soft device that tells a test what the engine does at
// the verbs, as the soak observes it (bench/soak_verbs.go): tests watch,
// hold and interleave the engine at the device rather than through hooks
// inside it. The callbacks are set before New and never changed; each
// runs on the goroutine that made the verbs call.
type wrapDevice struct {
	*soft.Device
	// qpModified runs after a QP's Modify succeeded; ctx is the QP's
	// QPConfig.Context (a *rxConn, *txConn or *udQP of the engine).
	qpModified func(ctx any, attr hca.QPAttr)
	// beforePost runs before a QP's PostSend.
	beforePost func(ctx any, wrs []hca.SendWR)
	// polled runs after every Poll of a CQ with the completions it
	// returned (none too).
	polled func(cq *wrapCQ, wcs []hca.WC)
	// mut are the soak's mutations the engine finds on the device.
	mut mutation.Soak
}

// newWrapDevice wraps a new device of fab.
func newWrapDevice(t *testing.T, fab *soft.Fabric, name string) *wrapDevice {
	t.Helper()
	dev, err := fab.NewDevice(name)
	if err != nil {
		t.Fatal(err)
	}
	return &wrapDevice{Device: dev}
}

func (d *wrapDevice) CreateCQ(cfg hca.CQConfig) (hca.CQ, error) {
	cq, err := d.Device.CreateCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &wrapCQ{CQ: cq, dev: d}, nil
}

func (d *wrapDevice) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	cfg.SendCQ, cfg.RecvCQ = softCQ(cfg.SendCQ), softCQ(cfg.RecvCQ)
	qp, err := d.Device.CreateQP(cfg)
	if err != nil {
		return nil, err
	}
	return &wrapQP{QP: qp, dev: d, ctx: cfg.Context}, nil
}

// wrapCQ is a CQ of a wrapDevice.
type wrapCQ struct {
	hca.CQ
	dev *wrapDevice
}

func (c *wrapCQ) Poll(into []hca.WC) int {
	n := c.CQ.Poll(into)
	if f := c.dev.polled; f != nil {
		f(c, into[:n])
	}
	return n
}

// softCQ is the soft fabric's CQ behind cq (the fabric's own calls, such
// as HoldCompletions, want it).
func softCQ(cq hca.CQ) hca.CQ {
	if w, ok := cq.(*wrapCQ); ok {
		return w.CQ
	}
	return cq
}

// wrapQP is a QP of a wrapDevice.
type wrapQP struct {
	hca.QP
	dev *wrapDevice
	ctx any
}

func (q *wrapQP) Modify(attr hca.QPAttr) error {
	if err := q.QP.Modify(attr); err != nil {
		return err
	}
	if f := q.dev.qpModified; f != nil {
		f(q.ctx, attr)
	}
	return nil
}

func (q *wrapQP) PostSend(wrs []hca.SendWR) (int, error) {
	if f := q.dev.beforePost; f != nil {
		f(q.ctx, wrs)
	}
	return q.QP.PostSend(wrs)
}

// eventsTo is an EventObserver handing every event of kind to ch
// (which must not fill up).
type eventsTo struct {
	kind EventKind
	ch   chan<- Event
}

func (o eventsTo) ObserveEvent(e Event) {
	if e.Kind == o.kind {
		o.ch <- e
	}
}

// SoakMutations hands the engine the mutations a test set on the device
// (mutation.Carrier), as the soak's device does.
func (d *wrapDevice) SoakMutations() mutation.Soak { return d.mut }
