package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/tap"
)

// fakeEngine records what the lab asks of the engine; its hosts hold the
// real TAP devices.
type fakeEngine struct {
	mu      sync.Mutex
	fabrics []*fakeFabric
}

func (e *fakeEngine) NewFabric(int64, *slog.Logger) (Fabric, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := &fakeFabric{}
	e.fabrics = append(e.fabrics, f)
	return f, nil
}

type fakeFabric struct {
	mu     sync.Mutex
	hosts  []*fakeHost
	closed bool
}

func (f *fakeFabric) AddHost(host, ifname string, dev *tap.Device, addrs []netip.Prefix, mode string, mtu int) (Host, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := os.Stat(filepath.Join("/run/netns", host)); err != nil {
		return nil, fmt.Errorf("namespace %s missing when adding its host: %w", host, err)
	}
	if dev.Name() != ifname {
		return nil, fmt.Errorf("dev %s, want %s", dev.Name(), ifname)
	}
	h := &fakeHost{fakeEndpoint: fakeEndpoint{info: control.InterfaceInfo{Host: host, Name: ifname, Mode: mode, MTU: 65520, Addrs: []string{addrs[0].String()}}}, dev: dev}
	f.hosts = append(f.hosts, h)
	return h, nil
}

func (f *fakeFabric) Close() error { f.mu.Lock(); f.closed = true; f.mu.Unlock(); return nil }

type fakeHost struct {
	fakeEndpoint
	dev    *tap.Device
	closed bool
}

func (h *fakeHost) Close() error { h.closed = true; return h.dev.Close() }

func TestFabricBuildsServesAndRemovesEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (uid 0) to create network namespaces and TAP devices")
	}
	for _, n := range []string{"ipoib-h1", "ipoib-h2", "ipoib-h3"} {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err == nil {
			t.Skipf("namespace %s exists: an ipoib fabric is running on this machine", n)
		}
	}
	eng := &fakeEngine{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	controlDir, markerDir := t.TempDir(), t.TempDir()
	var showOut string
	env := Env{
		Euid: os.Geteuid, ControlDir: controlDir, MarkerDir: markerDir, Engine: eng,
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
	if len(eng.fabrics) != 1 || len(eng.fabrics[0].hosts) != 3 || !eng.fabrics[0].closed {
		t.Fatalf("engine use: %+v", eng.fabrics)
	}
	for _, h := range eng.fabrics[0].hosts {
		if !h.closed {
			t.Errorf("host %s not closed", h.info.Host)
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
