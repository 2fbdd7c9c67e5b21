package soak

import (
	"os"
	"testing"
)

// shortRoCEv2Soak is shortSoak on the RoCEv2 loopback backend with its
// default faults.
func shortRoCEv2Soak(t *testing.T, until func(Progress) bool) Config {
	cfg := shortSoak(t, until)
	cfg.HCA = HCARoCEv2
	return cfg
}

// TestSoakRoCEv2Short: the soak passes on the RoCEv2 backend with its UDP
// faults and held completions, and the transport worked for it.
func TestSoakRoCEv2Short(t *testing.T) {
	goal := soakReapGoal()
	rep := runSoakT(t, shortRoCEv2Soak(t, func(p Progress) bool {
		return p.Engine.StaleReaped >= goal && p.Engine.DrainsCompleted >= goal/4
	}))
	if rep.Violations != 0 {
		t.Fatalf("%d violations", rep.Violations)
	}
	if rep.Settings.HCA != HCARoCEv2 || rep.Settings.RoCEv2 == nil || rep.Settings.Faults != nil {
		t.Fatalf("settings do not name the backend: %+v", rep.Settings)
	}
	if rep.Engine.StaleReaped < minStaleReaps || rep.Engine.DrainsCompleted == 0 || rep.Engine.LastWQESeen == 0 {
		t.Fatalf("too little reaping: %+v", rep.Engine)
	}
	if err := soakCarried(rep); err != nil {
		t.Fatal(err)
	}
	f := rep.Fabric
	if f.UDPDropped == 0 || f.UDPDuplicated == 0 || f.Retransmits == 0 || f.DelayedCompletions == 0 {
		t.Fatalf("faults or transport recovery not exercised: %+v", f)
	}
}

// TestSoakRoCEv2IPv6: the soak passes on IPv6 loopback addresses.
func TestSoakRoCEv2IPv6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) for a private network namespace with IPv6 addresses on its lo")
	}
	cfg := shortRoCEv2Soak(t, func(p Progress) bool { return p.Engine.StaleReaped >= 4*minStaleReaps })
	cfg.Hosts = 6
	cfg.RoCEv2.IPv6 = true
	rep := runSoakT(t, cfg)
	if rep.Violations != 0 || rep.Engine.StaleReaped < minStaleReaps {
		t.Fatalf("%d violations, %d stale reaps", rep.Violations, rep.Engine.StaleReaped)
	}
	if err := soakCarried(rep); err != nil {
		t.Fatal(err)
	}
}

// TestSoakRoCEv2CatchesMutations: each mutation fails the soak on the
// RoCEv2 backend with the invariant it breaks.
func TestSoakRoCEv2CatchesMutations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   violKind
	}{
		{"skip dead flag", func(c *Config) { c.Mutations.SkipDeadFlag = true }, violDeadDelivered},
		{"skip drain", func(c *Config) { c.Mutations.SkipDrain = true }, violAfterReap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := shortRoCEv2Soak(t, untilViolated(tc.want.String()))
			tc.mutate(&cfg)
			rep := runSoakT(t, cfg)
			if violations(rep, tc.want.String()) == 0 {
				t.Fatalf("%s went unnoticed on rocev2 in %v: %d violations", tc.name, rep.Elapsed, rep.Violations)
			}
		})
	}
}
