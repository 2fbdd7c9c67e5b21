package soak

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// soakDeadline bounds each soak test's traffic; the tests end it earlier,
// as soon as what they look for happened (Config.Until), so a fast
// machine takes a second or two and a loaded one gets the time it needs.
// With the end-of-soak checks each test stays under ~15 s.
const soakDeadline = 10 * time.Second

// shortSoak is the configuration of the soak tests: fewer hosts, traffic
// until the test's goal or soakDeadline.
func shortSoak(t *testing.T, until func(Progress) bool) Config {
	cfg := DefaultConfig()
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

func runSoakT(t *testing.T, cfg Config) *Report {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	return rep
}

func violations(rep *Report, name string) uint64 {
	for _, inv := range rep.Invariants {
		if inv.Name == name {
			return inv.Violations
		}
	}
	return 0
}

func TestSoakShort(t *testing.T) {
	goal := soakReapGoal()
	rep := runSoakT(t, shortSoak(t, func(p Progress) bool {
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
	if err := soakCarried(rep); err != nil {
		t.Fatal(err)
	}
	if rep.Fabric.DelayedCompletions == 0 {
		t.Fatalf("no completions delayed: faults off? %+v", rep.Fabric)
	}
}

// soakCarried checks what the traffic of a passing soak must show on any
// machine: packets carried end to end, over RC connections, and every
// packet missing accounted for by a named drop. How many of the sent
// packets arrive is not among them: it depends on how much CPU the
// pollers got against the generators (a loaded machine drops more at
// full queues, each drop counted), not on correctness.
func soakCarried(rep *Report) error {
	tr := rep.Traffic
	switch {
	case tr.Sent == 0 || tr.Received == 0:
		return fmt.Errorf("soak carried no traffic: %d sent, %d received", tr.Sent, tr.Received)
	case rep.Fabric.RCMessages == 0:
		return fmt.Errorf("soak carried no RC message: %d sent, %d received", tr.Sent, tr.Received)
	case tr.Received > tr.Sent:
		return fmt.Errorf("%d packets received of %d sent", tr.Received, tr.Sent)
	case tr.Lost != tr.Sent-tr.Received || tr.Lost > tr.Explained:
		return fmt.Errorf("losses not explained: %d sent, %d received, %d lost, %d drops counted",
			tr.Sent, tr.Received, tr.Lost, tr.Explained)
	}
	return nil
}

// soakCarried fails the reports it must: no traffic, no RC, a loss no
// drop explains; and passes a slow soak that lost most packets to counted
// drops.
func TestSoakCarried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tr     Traffic
		rc     uint64
		wantOK bool
	}{
		{"no traffic", Traffic{}, 0, false},
		{"nothing received", Traffic{Sent: 100, Lost: 100, Explained: 100}, 10, false},
		{"no RC", Traffic{Sent: 100, Received: 100}, 0, false},
		{"unexplained loss", Traffic{Sent: 100, Received: 90, Lost: 10, Explained: 9}, 90, false},
		{"loss misreported", Traffic{Sent: 100, Received: 90, Lost: 0}, 90, false},
		{"more received than sent", Traffic{Sent: 90, Received: 100}, 100, false},
		{"slow and lossy", Traffic{Sent: 5683, Received: 2275, Lost: 3408, Explained: 3408}, 2275, true},
		{"all delivered", Traffic{Sent: 100, Received: 100}, 100, true},
	} {
		err := soakCarried(&Report{Traffic: tc.tr, Fabric: Fabric{RCMessages: tc.rc}})
		if (err == nil) != tc.wantOK {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.wantOK)
		}
	}
}

// untilViolated ends a mutation soak once invariant name was violated and
// at least minStaleReaps connections were reaped.
func untilViolated(name string) func(Progress) bool {
	return func(p Progress) bool {
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
	cfg := DefaultConfig()
	cfg.Hosts = 4
	cfg.Duration = time.Minute
	cfg.CheckEvery = 20 * time.Millisecond
	var calls int
	var last Progress
	cfg.Until = func(p Progress) bool {
		calls++ // only the soak's one Until goroutine calls it
		last = p
		return p.Engine.Reaped >= 1
	}
	rep := runSoakT(t, cfg)
	if rep.Elapsed >= cfg.Duration {
		t.Fatalf("ran %v: Until did not end the soak", rep.Elapsed)
	}
	// Run returned after the Until goroutine ended, which orders its
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
