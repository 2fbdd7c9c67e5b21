package soft

import (
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// rig is a pair of devices with an RC connection a -> b and a UD QP each,
// built directly on the soft types for white-box tests.
type rig struct {
	f          *Fabric
	da, db     *Device
	a, b       *qp
	acq, bcq   *cq
	srq        *srq
	wake       chan struct{}
	lastEvents chan hca.AsyncEvent
}

type rigOpts struct {
	srq      bool
	rnrRetry uint8
	retry    uint8
	timeout  uint8
	minRNR   uint8
	cqSize   int
	// inline makes both CQs' completion events inline: raised before the
	// verb that caused them returns, so a test can assert on them at once.
	inline bool
}

func newRig(t *testing.T, cfg Config, o rigOpts) *rig {
	t.Helper()
	r := &rig{f: NewFabric(cfg), wake: make(chan struct{}, 1), lastEvents: make(chan hca.AsyncEvent, 16)}
	t.Cleanup(func() { r.f.Close() })
	var err error
	if r.da, err = r.f.NewDevice("a"); err != nil {
		t.Fatal(err)
	}
	if r.db, err = r.f.NewDevice("b"); err != nil {
		t.Fatal(err)
	}
	size := o.cqSize
	if size == 0 {
		size = 4096
	}
	signal := func() {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	acq, _ := r.da.CreateCQ(hca.CQConfig{Size: size, OnCompletion: signal, InlineCompletion: o.inline})
	bcq, _ := r.db.CreateCQ(hca.CQConfig{Size: size, OnCompletion: signal, InlineCompletion: o.inline})
	r.acq, r.bcq = acq.(*cq), bcq.(*cq)
	var s hca.SRQ
	if o.srq {
		s, _ = r.db.CreateSRQ(hca.SRQConfig{MaxWR: 4096})
		r.srq = s.(*srq)
	}
	a, err := r.da.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: acq, RecvCQ: acq, MaxSendWR: 1024, MaxRecvWR: 1024, Context: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.db.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: bcq, RecvCQ: bcq, SRQ: s, MaxSendWR: 1024, MaxRecvWR: 1024, Context: "b",
		OnEvent: func(ev hca.AsyncEvent) { r.lastEvents <- ev }})
	if err != nil {
		t.Fatal(err)
	}
	r.a, r.b = a.(*qp), b.(*qp)
	for _, p := range [][2]*qp{{r.a, r.b}, {r.b, r.a}} {
		must(t, p[0].Modify(hca.QPAttr{State: hca.QPStateInit}))
		must(t, p[0].Modify(hca.QPAttr{State: hca.QPStateRTR, DestQPN: p[1].qpn, DestGID: p[1].dev.gid, MinRNRTimer: o.minRNR}))
	}
	must(t, r.a.Modify(hca.QPAttr{State: hca.QPStateRTS, RNRRetry: o.rnrRetry, RetryCount: o.retry, Timeout: o.timeout}))
	must(t, r.b.Modify(hca.QPAttr{State: hca.QPStateRTS}))
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// waitCQ returns n completions of c, waiting on the rig's completion
// signal between polls.
func (r *rig) waitCQ(t *testing.T, c *cq, n int) []hca.WC {
	t.Helper()
	out := make([]hca.WC, 0, n)
	buf := make([]hca.WC, 64)
	for len(out) < n {
		k := c.Poll(buf[:min(64, n-len(out))])
		out = append(out, buf[:k]...)
		if k > 0 || c.Notify(true) {
			continue
		}
		<-r.wake
	}
	return out
}

func (r *rig) postRecvs(t *testing.T, n, size int) [][]byte {
	t.Helper()
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
		wr := []hca.RecvWR{{ID: uint64(i), Buf: bufs[i]}}
		var err error
		if r.srq != nil {
			_, err = r.srq.PostRecv(wr)
		} else {
			_, err = r.b.PostRecv(wr)
		}
		must(t, err)
	}
	return bufs
}
