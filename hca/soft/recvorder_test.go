package soft

import (
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// recvIDs sends one RC message per byte of payload a -> b and returns the
// receive WR ids b's completions carry, in completion order.
func recvIDs(t *testing.T, r *rig, payload []byte) []uint64 {
	t.Helper()
	for k, c := range payload {
		if _, err := r.a.PostSend([]hca.SendWR{{ID: uint64(100 + k), Data: []byte{c}}}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []uint64
	for _, wc := range r.waitCQ(t, r.bcq, len(payload)) {
		if wc.Status != hca.StatusSuccess || wc.ByteLen != 1 {
			t.Fatalf("receive %+v, want a 1-byte success", wc)
		}
		ids = append(ids, wc.ID)
	}
	return ids
}

func TestReceiveOrder(t *testing.T) {
	for _, tc := range []struct {
		order ReceiveOrder
		srq   bool
		want  []uint64
	}{
		{ReceiveOldestFirst, false, []uint64{0, 1, 2, 3}},
		{ReceiveOldestFirst, true, []uint64{0, 1, 2, 3}},
		{ReceiveNewestFirst, false, []uint64{3, 2, 1, 0}},
		{ReceiveNewestFirst, true, []uint64{3, 2, 1, 0}},
	} {
		name := tc.order.String()
		if tc.srq {
			name += "/srq"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t, Config{ReceiveOrder: tc.order}, rigOpts{srq: tc.srq})
			bufs := r.postRecvs(t, 4, 8)
			got := recvIDs(t, r, []byte("abcd"))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("receive ids %v, want %v", got, tc.want)
			}
			for k, id := range got {
				if b := bufs[id][0]; b != "abcd"[k] {
					t.Fatalf("message %d landed as %q in buffer %d", k, b, id)
				}
			}
		})
	}
}

// A buffer reposted while others wait is the next one used newest-first:
// the property that keeps a consumer's working set small.
func TestReceiveNewestFirstReusesRepostedBuffer(t *testing.T) {
	r := newRig(t, Config{ReceiveOrder: ReceiveNewestFirst}, rigOpts{srq: true})
	bufs := r.postRecvs(t, 3, 8) // ids 0,1,2
	if got := recvIDs(t, r, []byte("x")); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("first receive in %v, want [2]", got)
	}
	must(t, func() error { _, err := r.srq.PostRecv([]hca.RecvWR{{ID: 2, Buf: bufs[2]}}); return err }())
	if got := recvIDs(t, r, []byte("yz")); !slices.Equal(got, []uint64{2, 1}) {
		t.Fatalf("receives in %v, want [2 1]", got)
	}
	if n := r.srq.Posted(); n != 1 {
		t.Fatalf("SRQ holds %d buffers, want 1", n)
	}
}

// Moving a QP to Error flushes its own receive queue in posted order
// whatever the receive order.
func TestReceiveNewestFirstFlushesInPostedOrder(t *testing.T) {
	r := newRig(t, Config{ReceiveOrder: ReceiveNewestFirst}, rigOpts{})
	r.postRecvs(t, 3, 8)
	must(t, r.b.Modify(hca.QPAttr{State: hca.QPStateError}))
	var ids []uint64
	for _, wc := range r.waitCQ(t, r.bcq, 3) {
		if wc.Status != hca.StatusWRFlushErr {
			t.Fatalf("flush completion %+v, want WR_FLUSH_ERR", wc)
		}
		ids = append(ids, wc.ID)
	}
	if !slices.Equal(ids, []uint64{0, 1, 2}) {
		t.Fatalf("flushed %v, want [0 1 2]", ids)
	}
}

func TestReceiveOrderString(t *testing.T) {
	if s := ReceiveOrder(7).String(); s != "ReceiveOrder(7)" {
		t.Fatalf("String of an unknown order: %q", s)
	}
}
