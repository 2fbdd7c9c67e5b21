package cli

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/control"
)

// TestFabricBuildsServesAndRemovesEverything runs the real lab (soft
// fabric, ipoibcm, kernel TAPs in namespaces): show sees every host while
// it runs, and nothing is left once it stops.
func TestFabricBuildsServesAndRemovesEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (uid 0) to create network namespaces and TAP devices")
	}
	for _, n := range []string{"ipoib-h1", "ipoib-h2", "ipoib-h3"} {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err == nil {
			t.Skipf("namespace %s exists: an ipoib fabric is running on this machine", n)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	controlDir, markerDir := t.TempDir(), t.TempDir()
	var showOut string
	env := Env{
		Euid: os.Geteuid, ControlDir: controlDir, MarkerDir: markerDir,
		fabricReady: func(path string) {
			// The lab is up: show must see all three hosts, then stop it.
			r := runCLI(t, Env{ControlDir: controlDir}, "show")
			showOut = r.stdout + r.stderr
			cancel()
		},
	}
	r := runCLIContext(ctx, t, env, "fabric", "--hosts", "3", "--prefix", "10.77.5.0/24", "--mode", "datagram", "--log-level", "warn")
	if r.code != ExitOK {
		t.Fatalf("fabric exit %d stderr %s", r.code, r.stderr)
	}
	for _, want := range []string{"ipoib-h1: ib0:", "ipoib-h3: ib0:", "inet 10.77.5.3/24", "mode datagram"} {
		if !strings.Contains(showOut, want) {
			t.Errorf("show during the lab lacks %q:\n%s", want, showOut)
		}
	}
	for _, n := range []string{"ipoib-h1", "ipoib-h2", "ipoib-h3"} {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("namespace %s left behind", n)
		}
		if _, err := os.Stat(filepath.Join(markerDir, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("marker %s left behind", n)
		}
	}
	if paths, _ := control.Discover(controlDir); len(paths) != 0 {
		t.Errorf("control sockets left behind: %v", paths)
	}
}

func runCLIContext(ctx context.Context, t *testing.T, env Env, args ...string) result {
	t.Helper()
	var out, errOut strings.Builder
	env.Stdout, env.Stderr = &out, &errOut
	code := Main(ctx, args, env)
	return result{code, out.String(), errOut.String()}
}
