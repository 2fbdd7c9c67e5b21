package core

import (
	"errors"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

type fakeQP struct{ gone bool }

func (q *fakeQP) Destroyed() bool { return q.gone }

func TestRing(t *testing.T) {
	a, b := &fakeQP{}, &fakeQP{}
	r := NewRing[*fakeQP](3)
	into := make([]hca.WC, 4)
	// Wrap the ring a few times: order and counts hold across the end.
	for round := range 4 {
		for i := range 3 {
			if !r.Push(Entry[*fakeQP]{WC: hca.WC{ID: uint64(round*3 + i)}, QP: a}) {
				t.Fatalf("round %d: push %d refused", round, i)
			}
		}
		if r.Push(Entry[*fakeQP]{QP: a}) {
			t.Fatal("push into a full ring accepted")
		}
		n, gone := r.Poll(into[:2])
		if n != 2 || gone != 0 || into[0].ID != uint64(round*3) || into[1].ID != uint64(round*3+1) {
			t.Fatalf("round %d: poll %d %d %+v", round, n, gone, into[:2])
		}
		if n, _ := r.Poll(into); n != 1 || into[0].ID != uint64(round*3+2) || r.Len() != 0 {
			t.Fatalf("round %d: second poll %d %+v len %d", round, n, into[0], r.Len())
		}
	}
	r.Push(Entry[*fakeQP]{WC: hca.WC{ID: 1}, QP: a})
	r.Push(Entry[*fakeQP]{WC: hca.WC{ID: 2}, QP: b})
	r.Push(Entry[*fakeQP]{WC: hca.WC{ID: 3}}) // no QP
	b.gone = true
	if n, gone := r.Poll(into); n != 3 || gone != 1 {
		t.Fatalf("poll with a destroyed QP: %d %d", n, gone)
	}

	for i := range 3 {
		r.Push(Entry[*fakeQP]{WC: hca.WC{ID: uint64(i)}, QP: []*fakeQP{a, b, a}[i]})
	}
	if got := r.Purge(a); got != 2 || r.Len() != 1 {
		t.Fatalf("purge removed %d, %d left", got, r.Len())
	}
	if n, _ := r.Poll(into); n != 1 || into[0].ID != 1 {
		t.Fatalf("after purge: %d %+v", n, into[0])
	}
	r.Push(Entry[*fakeQP]{QP: a})
	r.Clear()
	if n, _ := r.Poll(into); n != 0 {
		t.Fatalf("cleared ring polled %d", n)
	}
}

func TestAttachments(t *testing.T) {
	mgid := hca.GID{0: 0xff, 1: 0x12, 15: 1}
	var a Attachments
	if _, err := a.Attach(hca.QPTypeRC, mgid); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("RC attach: %v", err)
	}
	if _, err := a.Attach(hca.QPTypeUD, hca.GID{15: 1}); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("unicast attach: %v", err)
	}
	if added, err := a.Attach(hca.QPTypeUD, mgid); !added || err != nil {
		t.Fatalf("attach: %v %v", added, err)
	}
	if added, err := a.Attach(hca.QPTypeUD, mgid); added || err != nil || a.Len() != 1 {
		t.Fatalf("second attach: %v %v, %d groups", added, err, a.Len())
	}
	if err := a.CheckDestroy(); !errors.Is(err, hca.ErrBusy) {
		t.Fatalf("destroy while attached: %v", err)
	}
	if err := a.Detach(mgid); err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(mgid); !errors.Is(err, hca.ErrInvalidArgument) {
		t.Fatalf("second detach: %v", err)
	}
	if err := a.CheckDestroy(); err != nil || a.Len() != 0 {
		t.Fatalf("destroy after detach: %v, %d groups", err, a.Len())
	}
}
