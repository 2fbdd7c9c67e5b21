package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// shortSoak is the configuration of the soak tests: fewer hosts and a few
// seconds, so each test stays well under 15 s even with -race.
func shortSoak(t *testing.T) SoakConfig {
	cfg := DefaultSoakConfig()
	cfg.Hosts = 12
	cfg.Duration = 5 * time.Second
	if testing.Short() {
		cfg.Duration = 2 * time.Second
	}
	if os.Getenv("SOAK_VERBOSE") != "" {
		cfg.Progress = os.Stderr
		cfg.ProgressEvery = time.Second
	}
	return cfg
}

func runSoakT(t *testing.T, cfg SoakConfig) *SoakReport {
	t.Helper()
	rep, err := RunSoak(context.Background(), cfg)
	if err != nil {
		t.Fatalf("RunSoak: %v", err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	return rep
}

func violations(rep *SoakReport, name string) uint64 {
	for _, inv := range rep.Invariants {
		if inv.Name == name {
			return inv.Violations
		}
	}
	return 0
}

func TestSoakShort(t *testing.T) {
	rep := runSoakT(t, shortSoak(t))
	if rep.Violations != 0 {
		t.Fatalf("%d violations", rep.Violations)
	}
	// The soak must have done what it is for: connections reaped as
	// stale many times, through LAST_WQE and drains, packets delivered.
	if rep.Engine.StaleReaped < 10 || rep.Engine.DrainsCompleted == 0 || rep.Engine.LastWQESeen == 0 {
		t.Fatalf("too little reaping: %+v", rep.Engine)
	}
	if rep.Traffic.Received == 0 || rep.Traffic.Received*2 < rep.Traffic.Sent {
		t.Fatalf("traffic: %+v", rep.Traffic)
	}
	if rep.Fabric.DelayedCompletions == 0 {
		t.Fatalf("no completions delayed: faults off? %+v", rep.Fabric)
	}
}

func TestSoakCatchesSkipDeadFlag(t *testing.T) {
	cfg := shortSoak(t)
	cfg.UnsafeSkipDeadFlag = true
	rep := runSoakT(t, cfg)
	if rep.Violations == 0 || violations(rep, violDeadDelivered.String()) == 0 {
		t.Fatalf("skipping the dead flag went unnoticed: %d violations", rep.Violations)
	}
}

func TestSoakCatchesSkipDrain(t *testing.T) {
	cfg := shortSoak(t)
	cfg.UnsafeSkipDrain = true
	rep := runSoakT(t, cfg)
	if rep.Violations == 0 || violations(rep, violAfterReap.String()) == 0 {
		t.Fatalf("skipping the drain went unnoticed: %d violations", rep.Violations)
	}
}

func TestSoakMainJSONAndExit(t *testing.T) {
	var out, errb bytes.Buffer
	code := SoakMain(context.Background(), []string{"--hosts", "4", "--duration", "500ms", "--json"}, &out, &errb)
	var rep SoakReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s\nstderr: %s", err, out.String(), errb.String())
	}
	if rep.Settings.Hosts != 4 || len(rep.Invariants) != int(numViolKinds) {
		t.Fatalf("report settings/invariants: %+v", rep.Settings)
	}
	want := SoakExitOK
	if rep.Violations > 0 {
		want = SoakExitViolation
	}
	if code != want {
		t.Fatalf("exit %d with %d violations", code, rep.Violations)
	}
	if !strings.Contains(errb.String(), "soak ") {
		t.Fatalf("no progress line on stderr: %q", errb.String())
	}
	if code := SoakMain(context.Background(), []string{"--hosts", "1"}, &out, &errb); code != SoakExitUsage {
		t.Fatalf("--hosts 1: exit %d, want %d", code, SoakExitUsage)
	}
	if code := SoakMain(context.Background(), []string{"--bogus"}, &out, &errb); code != SoakExitUsage {
		t.Fatalf("--bogus: exit %d, want %d", code, SoakExitUsage)
	}
}
