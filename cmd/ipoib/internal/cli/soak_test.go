package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/soak"
)

// TestSoakJSONAndExit: the flags reach the soak's Config, --json prints
// the report, the exit follows the violations, and a bad value is a usage
// error before anything runs.
func TestSoakJSONAndExit(t *testing.T) {
	r := runCLI(t, Env{}, "soak", "--hosts", "4", "--duration", "500ms", "--json")
	var rep soak.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s\nstderr: %s", err, r.stdout, r.stderr)
	}
	if rep.Settings.Hosts != 4 || rep.Settings.Duration != "500ms" || len(rep.Invariants) == 0 {
		t.Fatalf("report settings/invariants: %+v, %d invariants", rep.Settings, len(rep.Invariants))
	}
	want := ExitOK
	if rep.Violations > 0 {
		want = ExitFail
	}
	if r.code != want {
		t.Fatalf("exit %d with %d violations", r.code, rep.Violations)
	}
	if !strings.Contains(r.stderr, "soak ") {
		t.Fatalf("no progress line on stderr: %q", r.stderr)
	}
	for _, args := range [][]string{{"--hosts", "1"}, {"--bogus"}, {"extra"}} {
		if r := runCLI(t, Env{}, append([]string{"soak"}, args...)...); r.code != ExitUsage || strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("%v: exit %d, want %d, with one line: %q", args, r.code, ExitUsage, r.stderr)
		}
	}
}

// TestSoakBackendFlags: --json names the backend; a flag of the other
// backend, or an unknown backend, is a usage error.
func TestSoakBackendFlags(t *testing.T) {
	r := runCLI(t, Env{}, "soak", "--hca", "rocev2", "--hosts", "3", "--duration", "300ms", "--json", "--quiet")
	var rep struct {
		Settings struct {
			HCA    string          `json:"hca"`
			RoCEv2 json.RawMessage `json:"rocev2"`
		} `json:"settings"`
		Violations uint64 `json:"violations"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s\nstderr: %s", err, r.stdout, r.stderr)
	}
	if rep.Settings.HCA != soak.HCARoCEv2 || len(rep.Settings.RoCEv2) == 0 {
		t.Fatalf("JSON settings do not name the backend: %s", r.stdout)
	}
	if want := map[bool]int{false: ExitOK, true: ExitFail}[rep.Violations > 0]; r.code != want {
		t.Fatalf("exit %d with %d violations", r.code, rep.Violations)
	}
	for _, args := range [][]string{
		{"--hca", "rocev2", "--purge"},
		{"--hca", "rocev2", "--rnr", "0.1"},
		{"--udp-loss", "0.1"},
		{"--ipv6"},
		{"--hca", "ib"},
	} {
		r := runCLI(t, Env{}, append([]string{"soak"}, args...)...)
		if r.code != ExitUsage {
			t.Fatalf("%v: exit %d, want %d", args, r.code, ExitUsage)
		}
		if n := strings.Count(r.stderr, "\n"); n != 1 {
			t.Fatalf("%v: want one error line, got %q", args, r.stderr)
		}
	}
}
