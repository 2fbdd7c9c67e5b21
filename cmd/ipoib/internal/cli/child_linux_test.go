package cli

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// TestChildDelLeavesNothing runs the lab in-process and adds and deletes
// children over the control socket: once deleted, the child's TAP is gone
// from its namespace and every goroutine it started (engine pollers,
// control loop, host reader, netlink watch) has ended.
func TestChildDelLeavesNothing(t *testing.T) {
	testutil.NeedRoot(t)
	const ns = "ipoib-t13g1"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	controlDir, markerDir := t.TempDir(), t.TempDir()
	var base int
	var leaked error
	var steps []string
	env := Env{
		Euid: os.Geteuid, ControlDir: controlDir, MarkerDir: markerDir,
		fabricReady: func(string) {
			defer cancel()
			cli := Env{ControlDir: controlDir}
			base = runtime.NumGoroutine()
			for _, args := range [][]string{
				{"child", "add", "--host", ns, "--addr", "10.77.71.1/24", "0x8001"},
				{"child", "add", "--host", ns, "--name", "part2", "0x0002"},
				{"child", "del", "--host", ns, "ib0.8001"},
				{"child", "del", "--host", ns, "0x8002"},
			} {
				r := runCLI(t, cli, args...)
				steps = append(steps, strings.Join(args, " ")+" -> "+r.stdout+r.stderr)
				if r.code != ExitOK {
					return
				}
			}
			out, _ := exec.Command("ip", "-n", ns, "-br", "link").CombinedOutput()
			if strings.Contains(string(out), "ib0.8001") || strings.Contains(string(out), "part2") {
				steps = append(steps, "left in the kernel: "+string(out))
			}
			leaked = testutil.AwaitGoroutines(base, 5*time.Second)
		},
	}
	r := runCLIContext(ctx, t, env, "fabric", "--hosts", "2", "--netns-prefix", "ipoib-t13g", "--prefix", "10.77.70.0/24", "--log-level", "warn")
	if r.code != ExitOK {
		t.Fatalf("fabric exit %d stderr %s", r.code, r.stderr)
	}
	t.Logf("steps:\n%s", strings.Join(steps, "\n"))
	if len(steps) != 4 || strings.Contains(strings.Join(steps, "\n"), "left in the kernel") {
		t.Fatalf("steps:\n%s", strings.Join(steps, "\n"))
	}
	if !strings.Contains(steps[1], "ib0.0002") && !strings.Contains(steps[1], "part2: pkey 0x8002 membership limited parent ib0 added") {
		t.Errorf("limited child: %s", steps[1])
	}
	if leaked != nil {
		t.Fatalf("after child del: %v", leaked)
	}
}
