package cli

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/testutil"
)

// TestFabricBuildsServesAndRemovesEverything runs the real lab (soft
// fabric, ipoibcm, kernel TAPs in namespaces): show sees every host while
// it runs, and nothing is left once it stops.
func TestFabricBuildsServesAndRemovesEverything(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.SkipIfNetns(t, "ipoib-h1", "ipoib-h2", "ipoib-h3")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	controlDir, markerDir := t.TempDir(), t.TempDir()
	metricsAddr := borrowTCPAddr(t)
	var showOut string
	var linkUp, mtu float64
	env := Env{
		Euid: os.Geteuid, ControlDir: controlDir, MarkerDir: markerDir,
		fabricReady: func(path string) {
			// The lab is up: show must see all three hosts, the metrics
			// endpoint must serve them, then stop it.
			r := runCLI(t, Env{ControlDir: controlDir}, "show")
			showOut = r.stdout + r.stderr
			url := "http://" + metricsAddr + "/metrics"
			linkUp = scrapeValue(t, url, `ipoib_link_up{host="ipoib-h3"}`)
			mtu = scrapeValue(t, url, `ipoib_mtu_bytes{host="ipoib-h3"}`)
			cancel()
		},
	}
	r := runCLIContext(ctx, t, env, "fabric", "--hosts", "3", "--prefix", "10.77.5.0/24", "--mode", "datagram", "--log-level", "warn",
		"--metrics", metricsAddr)
	if r.code != ExitOK {
		t.Fatalf("fabric exit %d stderr %s", r.code, r.stderr)
	}
	if linkUp != 1 || mtu != 4092 {
		t.Errorf("metrics of ipoib-h3: link_up %v mtu %v, want 1 and 4092", linkUp, mtu)
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

// borrowTCPAddr is a loopback address with a port free a moment ago.
func borrowTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func runCLIContext(ctx context.Context, t *testing.T, env Env, args ...string) result {
	t.Helper()
	var out, errOut strings.Builder
	env.Stdout, env.Stderr = &out, &errOut
	code := Main(ctx, args, env)
	return result{code, out.String(), errOut.String()}
}
