package hca

import (
	"errors"
	"testing"
)

// legal is IBTA 10.3.1 figure 124 without SQD/SQE, written out as a table
// independent of CheckTransition's switch.
var legal = map[[2]QPState]bool{
	{QPStateReset, QPStateReset}: true, {QPStateReset, QPStateInit}: true, {QPStateReset, QPStateError}: true,
	{QPStateInit, QPStateReset}: true, {QPStateInit, QPStateInit}: true, {QPStateInit, QPStateRTR}: true, {QPStateInit, QPStateError}: true,
	{QPStateRTR, QPStateReset}: true, {QPStateRTR, QPStateRTS}: true, {QPStateRTR, QPStateError}: true,
	{QPStateRTS, QPStateReset}: true, {QPStateRTS, QPStateRTS}: true, {QPStateRTS, QPStateError}: true,
	{QPStateError, QPStateReset}: true, {QPStateError, QPStateError}: true,
}

func TestCheckTransitionTable(t *testing.T) {
	states := []QPState{QPStateReset, QPStateInit, QPStateRTR, QPStateRTS, QPStateError}
	for _, typ := range []QPType{QPTypeRC, QPTypeUD, QPTypeGSI} {
		for _, from := range states {
			for _, to := range states {
				err := CheckTransition(typ, from, to)
				if want := legal[[2]QPState{from, to}]; want != (err == nil) {
					t.Errorf("%s %s -> %s: err %v, want legal=%v", typ, from, to, err, want)
				}
				if err != nil && !errors.Is(err, ErrIllegalTransition) {
					t.Errorf("%s %s -> %s: %v does not wrap ErrIllegalTransition", typ, from, to, err)
				}
			}
		}
	}
}

// FuzzCheckTransition feeds arbitrary (possibly out-of-range) states: the
// check never panics, out-of-range states are always illegal, and in-range
// ones agree with the table.
func FuzzCheckTransition(f *testing.F) {
	f.Add(1, 0, 1)
	f.Add(2, 4, 0)
	f.Add(1, -1, 4)
	f.Add(3, 7, 2)
	f.Fuzz(func(t *testing.T, typ, from, to int) {
		err := CheckTransition(QPType(typ), QPState(from), QPState(to))
		inRange := func(s int) bool { return s >= int(QPStateReset) && s <= int(QPStateError) }
		if !inRange(from) || !inRange(to) {
			if err == nil {
				t.Fatalf("%d -> %d accepted", from, to)
			}
			return
		}
		if want := legal[[2]QPState{QPState(from), QPState(to)}]; want != (err == nil) {
			t.Fatalf("%d -> %d: %v, want legal=%v", from, to, err, want)
		}
		_ = QPState(from).String()
		_ = QPType(typ).String()
	})
}
