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

// soakDeadline bounds each soak test's traffic; the tests end it earlier,
// as soon as what they look for happened (SoakConfig.Until), so a fast
// machine takes a second or two and a loaded one gets the time it needs.
// With the end-of-soak checks each test stays under ~15 s.
const soakDeadline = 10 * time.Second

// shortSoak is the configuration of the soak tests: fewer hosts, traffic
// until the test's goal or soakDeadline.
func shortSoak(t *testing.T, until func(SoakProgress) bool) SoakConfig {
	cfg := DefaultSoakConfig()
	cfg.Hosts = 12
	cfg.Duration = soakDeadline
	cfg.CheckEvery = 50 * time.Millisecond
	cfg.Until = until
	if os.Getenv("SOAK_VERBOSE") != "" {
		cfg.Progress = os.Stderr
		cfg.ProgressEvery = time.Second
	}
	return cfg
}

// soakReapGoal is how much reaping TestSoakShort runs for: several hundred
// stale reaps (about 2 s on an idle machine) give the races many chances.
func soakReapGoal() uint64 {
	if testing.Short() {
		return 100
	}
	return 300
}

// minStaleReaps is the least a soak that reached its deadline must have
// reaped to count as having done its job.
const minStaleReaps = 10

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
	goal := soakReapGoal()
	rep := runSoakT(t, shortSoak(t, func(p SoakProgress) bool {
		return p.Engine.StaleReaped >= goal && p.Engine.DrainsCompleted >= goal/4
	}))
	if rep.Violations != 0 {
		t.Fatalf("%d violations", rep.Violations)
	}
	// The soak must have done what it is for: connections reaped as
	// stale many times, through LAST_WQE and drains, packets delivered.
	// Only a machine too loaded to reach the goal before the deadline
	// gets away with less, and never with fewer than minStaleReaps.
	if rep.Engine.StaleReaped < minStaleReaps || rep.Engine.DrainsCompleted == 0 || rep.Engine.LastWQESeen == 0 {
		t.Fatalf("too little reaping: %+v", rep.Engine)
	}
	if rep.Engine.StaleReaped < goal {
		t.Logf("deadline %v reached with %d stale reaps of the %d aimed for (loaded machine?)", soakDeadline, rep.Engine.StaleReaped, goal)
	}
	if rep.Traffic.Received == 0 || rep.Traffic.Received*2 < rep.Traffic.Sent {
		t.Fatalf("traffic: %+v", rep.Traffic)
	}
	if rep.Fabric.DelayedCompletions == 0 {
		t.Fatalf("no completions delayed: faults off? %+v", rep.Fabric)
	}
}

// untilViolated ends a mutation soak once invariant name was violated and
// at least minStaleReaps connections were reaped.
func untilViolated(name string) func(SoakProgress) bool {
	return func(p SoakProgress) bool {
		return p.Violations[name] > 0 && p.Engine.StaleReaped >= minStaleReaps
	}
}

func TestSoakCatchesSkipDeadFlag(t *testing.T) {
	cfg := shortSoak(t, untilViolated(violDeadDelivered.String()))
	cfg.Mutations.SkipDeadFlag = true
	rep := runSoakT(t, cfg)
	if rep.Violations == 0 || violations(rep, violDeadDelivered.String()) == 0 {
		t.Fatalf("skipping the dead flag went unnoticed in %v: %d violations", rep.Elapsed, rep.Violations)
	}
}

func TestSoakCatchesSkipDrain(t *testing.T) {
	cfg := shortSoak(t, untilViolated(violAfterReap.String()))
	cfg.Mutations.SkipDrain = true
	rep := runSoakT(t, cfg)
	if rep.Violations == 0 || violations(rep, violAfterReap.String()) == 0 {
		t.Fatalf("skipping the drain went unnoticed in %v: %d violations", rep.Elapsed, rep.Violations)
	}
}

// Until ends the traffic at its first true, well before Duration, and
// sees the counters move.
func TestSoakUntilEndsEarly(t *testing.T) {
	cfg := DefaultSoakConfig()
	cfg.Hosts = 4
	cfg.Duration = time.Minute
	cfg.CheckEvery = 20 * time.Millisecond
	var calls int
	var last SoakProgress
	cfg.Until = func(p SoakProgress) bool {
		calls++ // only the soak's one Until goroutine calls it
		last = p
		return p.Engine.Reaped >= 1
	}
	rep := runSoakT(t, cfg)
	if rep.Elapsed >= cfg.Duration {
		t.Fatalf("ran %v: Until did not end the soak", rep.Elapsed)
	}
	// RunSoak returned after the Until goroutine ended, which orders its
	// writes before these reads.
	if calls == 0 || last.Engine.Reaped < 1 || last.Elapsed <= 0 || last.Elapsed > rep.Elapsed {
		t.Fatalf("Until called %d times, last saw %+v (ran %v)", calls, last, rep.Elapsed)
	}
	if rep.Engine.Reaped < last.Engine.Reaped {
		t.Fatalf("report reaped %d < %d seen by Until", rep.Engine.Reaped, last.Engine.Reaped)
	}
	if rep.Violations != 0 {
		t.Fatalf("%d violations", rep.Violations)
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
