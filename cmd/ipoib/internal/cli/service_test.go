package cli

import (
	"bytes"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// Under journald each line carries its syslog priority and nothing
// else changes; a reload's level change takes effect at once.
func TestJournalLogger(t *testing.T) {
	var out bytes.Buffer
	level := new(slog.LevelVar)
	log := newLeveledLogger(&Env{Stderr: &out, Journal: true}, level).With("dev", "ib0")
	log.Debug("hidden")
	log.Info("up", "mode", "connected")
	log.Warn("careful")
	log.Error("broken")
	level.Set(slog.LevelDebug)
	log.Debug("shown")
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := []string{"<6>", "<4>", "<3>", "<7>"}
	if len(lines) != len(want) {
		t.Fatalf("lines:\n%s", out.String())
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]+"time=") || !strings.Contains(l, "dev=ib0") || strings.Contains(l, "\x1b") {
			t.Errorf("line %d %q: want prefix %s, logfmt, no ANSI", i, l, want[i])
		}
	}
	out.Reset()
	newLeveledLogger(&Env{Stderr: &out}, level).Info("plain")
	if !strings.HasPrefix(out.String(), "time=") || !strings.Contains(out.String(), "level=INFO") {
		t.Fatalf("outside journald: %q", out.String())
	}
}

// grownTable keeps every entry on its index: membership changes in
// place, new partitions go to the end, trailing removals go, and a
// removal before entries that stay is refused.
func TestGrownTable(t *testing.T) {
	for _, tc := range []struct {
		have, want, got []hca.PKey
		ok              bool
	}{
		{[]hca.PKey{0xffff, 0x8001}, []hca.PKey{0xffff, 0x8001, 0x8002}, []hca.PKey{0xffff, 0x8001, 0x8002}, true},
		{[]hca.PKey{0xffff, 0x8001}, []hca.PKey{0xffff, 0x0001}, []hca.PKey{0xffff, 0x0001}, true},
		{[]hca.PKey{0xffff, 0x8001, 0x8002}, []hca.PKey{0xffff, 0x8001}, []hca.PKey{0xffff, 0x8001}, true},
		{[]hca.PKey{0xffff, 0x8001, 0x8002}, []hca.PKey{0xffff, 0x8002, 0x8001}, []hca.PKey{0xffff, 0x8001, 0x8002}, true},
		{[]hca.PKey{0xffff, 0x8001, 0x8002}, []hca.PKey{0xffff, 0x8002}, nil, false},
	} {
		got, ok := grownTable(tc.have, tc.want)
		if ok != tc.ok || !slices.Equal(got, tc.got) {
			t.Errorf("grownTable(%#x, %#x) = %#x, %v; want %#x, %v", tc.have, tc.want, got, ok, tc.got, tc.ok)
		}
	}
}

func TestVersionText(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/ipoibcm/ipoib", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "2c54140abc"}, {Key: "vcs.time", Value: "2026-12-03T09:54:50Z"}, {Key: "vcs.modified", Value: "true"}}}
	got := versionText(bi, true)
	for _, want := range []string{"ipoib: github.com/ipoibcm/ipoib (devel)\n", "revision: 2c54140abc (modified)\n", "committed: 2026-12-03T09:54:50Z\n", "go: go1.26.8 linux/"} {
		if !strings.Contains(got, want) {
			t.Errorf("version lacks %q:\n%s", want, got)
		}
	}
	if got := versionText(&debug.BuildInfo{GoVersion: "go1.26.8"}, true); !strings.Contains(got, "revision: unknown") {
		t.Errorf("no VCS stamp: %s", got)
	}
}

// notLive names exactly the keys that changed and cannot change live.
func TestNotLive(t *testing.T) {
	a := UpOptions{Dev: "ib0", MTU: 0, Mode: "connected", Metrics: "x"}
	b := a
	b.MTU, b.Mode, b.Metrics = 9000, "datagram", "y"
	if got := notLive(a, b); !slices.Equal(got, []string{"mode", "mtu"}) {
		t.Fatalf("notLive = %v", got)
	}
}
