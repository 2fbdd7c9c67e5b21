package napi

import (
	"errors"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func TestNewValidatesConfig(t *testing.T) {
	handle := func([]hca.WC) {}
	cq := newFakeCQ(1)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"nil CQ", Config{Handle: handle}},
		{"nil Handle", Config{CQ: cq}},
		{"negative budget", Config{CQ: cq, Handle: handle, Budget: -1}},
		{"negative batch", Config{CQ: cq, Handle: handle, Batch: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, err := New(tc.cfg)
			if !errors.Is(err, ErrInvalidConfig) || ctx != nil {
				t.Errorf("New = %v, %v; want nil, ErrInvalidConfig", ctx, err)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	handle := func([]hca.WC) {}
	for _, tc := range []struct {
		name                    string
		budget, batch           int
		wantBudget, wantBatchSz int
	}{
		{"zero", 0, 0, DefaultBudget, DefaultBatch},
		{"explicit", 8, 2, 8, 2},
		{"batch above budget", 4, 16, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, err := New(Config{Name: "ib0-rx", CQ: newFakeCQ(1), Handle: handle, Budget: tc.budget, Batch: tc.batch})
			if err != nil {
				t.Fatal(err)
			}
			if ctx.cfg.Budget != tc.wantBudget || ctx.cfg.Batch != tc.wantBatchSz || len(ctx.wcs) != tc.wantBatchSz {
				t.Errorf("budget %d batch %d buffer %d, want %d %d %d",
					ctx.cfg.Budget, ctx.cfg.Batch, len(ctx.wcs), tc.wantBudget, tc.wantBatchSz, tc.wantBatchSz)
			}
			if ctx.Name() != "ib0-rx" {
				t.Errorf("Name %q", ctx.Name())
			}
		})
	}
}
