package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/tap"
)

func requireIperfRoot(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not in PATH: apt-get install iperf3")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip not in PATH: apt-get install iproute2")
	}
}

// TestIperfSuiteBaselines runs the three baselines for real (1 s each) and
// the ib0 step without a factory, which must be recorded as a failure.
func TestIperfSuiteBaselines(t *testing.T) {
	requireIperfRoot(t)
	owner := &tap.Owner{MarkerDir: t.TempDir()}
	var progress bytes.Buffer
	cfg := IperfSuiteConfig{
		Modes:    []string{"datagram"},
		MTU:      map[string]int{"datagram": 4092},
		Duration: time.Second,
		Owner:    owner,
		Progress: &progress,
		NetnsA:   fmt.Sprintf("ipoibt-%d-ba", os.Getpid()),
		NetnsB:   fmt.Sprintf("ipoibt-%d-bb", os.Getpid()),
	}
	rep, err := RunIperfSuite(context.Background(), cfg)
	if err != nil {
		t.Fatalf("suite: %v", err)
	}
	if len(rep.Runs) != 4 {
		t.Fatalf("%d runs, want 4", len(rep.Runs))
	}
	for k, want := range []struct {
		scenario string
		offloads bool
	}{{ScenarioVeth, true}, {ScenarioTapPipe, false}, {ScenarioTapPipeOffload, true}} {
		if run := rep.Runs[k]; run.Scenario != want.scenario || run.Offloads != want.offloads {
			t.Errorf("run %d: %s offloads %v, want %s offloads %v", k, run.Scenario, run.Offloads, want.scenario, want.offloads)
		}
	}
	for _, run := range rep.Runs[:3] {
		if run.Result == nil || run.Result.Gbps <= 0 {
			t.Errorf("%s: %+v, want a positive rate", run.Scenario, run)
			continue
		}
		// MSS follows the link MTU: 4092 - 40 (IP+TCP) - 12 (timestamps).
		if run.Result.MSS <= 0 || run.Result.MSS > 4092-40 {
			t.Errorf("%s: mss %d does not reflect mtu 4092", run.Scenario, run.Result.MSS)
		}
		t.Logf("%s at mtu %d: %.2f Gbit/s, %d retransmits", run.Scenario, run.MTU, run.Result.Gbps, run.Result.Retransmits)
	}
	if ib := rep.Runs[3]; ib.Scenario != ScenarioIB || ib.Err == "" {
		t.Errorf("ib0 run without factory: %+v, want an error", ib)
	}
	if !strings.Contains(progress.String(), "[1/4] veth") || !strings.Contains(progress.String(), "[4/4] ib0") {
		t.Errorf("progress:\n%s", progress.String())
	}
	for _, name := range []string{cfg.NetnsA, cfg.NetnsB} {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind", name)
		}
	}
}
