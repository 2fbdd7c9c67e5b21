package soak

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// TestSoakInterrupted: a context that ends once connections were reaped
// stops the traffic before the duration; the end checks still run, and
// the report says the run was interrupted, by what, and after how long,
// and never PASS.
func TestSoakInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	cause := errors.New("test signal received")
	cfg := shortSoak(t, func(p Progress) bool {
		if p.Engine.StaleReaped >= minStaleReaps {
			cancel(cause) // as a signal would, from outside the soak
		}
		return false // only the context ends this run
	})
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	if rep.Interrupted != cause.Error() || rep.Verdict() != "INTERRUPTED" {
		t.Fatalf("interrupted %q, verdict %s; want %q, INTERRUPTED", rep.Interrupted, rep.Verdict(), cause)
	}
	if rep.Elapsed >= cfg.Duration || rep.Engine.StaleReaped < minStaleReaps {
		t.Fatalf("ran %v of %v with %d stale reaps: the context did not end it", rep.Elapsed, cfg.Duration, rep.Engine.StaleReaped)
	}
	if rep.Violations != 0 {
		t.Fatalf("%d violations in an interrupted soak", rep.Violations)
	}
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "INTERRUPTED") || !strings.Contains(last, cause.Error()) || strings.Contains(table.String(), "PASS") {
		t.Fatalf("table ends %q", last)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"interrupted": "test signal received"`) {
		t.Fatalf("JSON does not say interrupted:\n%s", js.String())
	}
}
