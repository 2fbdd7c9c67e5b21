package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"strings"
	"sync"
	"testing"

	"github.com/ipoibcm/ipoib/control"
)

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env Env, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	env.Stdout, env.Stderr = &out, &errOut
	if env.Euid == nil {
		env.Euid = func() int { return 1000 }
	}
	code := Main(context.Background(), args, env)
	return result{code, out.String(), errOut.String()}
}

func TestFlagErrorsExitTwoWithOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"nosuchcmd"},
		{"show", "--bogus"},
		{"show", "extra"},
		{"mode"},
		{"mode", "fast"},
		{"mode", "datagram", "connected"},
		{"mode", "datagram", "--host"},
		{"fabric", "--hosts", "0"},
		{"fabric", "--hosts", "x"},
		{"fabric", "--mode", "turbo"},
		{"fabric", "--prefix", "10.0.0.0/30", "--hosts", "3"},
		{"fabric", "--prefix", "fd00::/64"},
		{"fabric", "--log-level", "loud"},
		{"fabric", "--offloads", "maybe"},
		{"bench", "--iperf", "--offloads", "1"},
		{"bench", "--offloads", "off"},
		{"bench", "--iperf", "--modes", "connected,warp"},
		{"bench", "--iperf", "--duration", "10ms"},
		{"bench", "--mtu", "100"},
		{"up", "--nope"},
		{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--pkey", "0x8000"},
		{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--pkey", "partition"},
		{"child"},
		{"child", "add"},
		{"child", "add", "0"},
		{"child", "add", "0x8000"},
		{"child", "add", "0x18001"},
		{"child", "add", "--name", "a/b", "0x8001"},
		{"child", "add", "--addr", "10.1.1.1", "0x8001"},
		{"child", "del", "--name", "ib0.8001", "ib0.8001"},
		{"child", "del", "0x0000"},
		{"child", "rename", "0x8001"},
		{"fabric", "--partition", "0x8001"},
		{"fabric", "--partition", "0x0001=1"},
		{"fabric", "--partition", "0x8001=1,1"},
		{"fabric", "--partition", "0x8001=1:half"},
		{"fabric", "--partition", "0x8001=1", "--partition", "0x8001=2"},
		{"fabric", "--hosts", "2", "--partition", "0x8001=1,3"},
		{"fabric", "--prefix", "255.255.255.0/24", "--partition", "0x8001=1"},
		{"show", "--dev", "a b"},
		{"mode", "datagram", "--dev", "waytoolong-name16"},
	} {
		r := runCLI(t, Env{}, args...)
		if r.code != ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, r.code, ExitUsage, r.stderr)
			continue
		}
		if lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n"); len(lines) != 1 || lines[0] == "" {
			t.Errorf("%v: stderr %q, want exactly one line", args, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("%v: stdout %q, want nothing (usage only on -h)", args, r.stdout)
		}
		if !strings.HasPrefix(r.stderr, "ipoib") {
			t.Errorf("%v: stderr %q does not name the program", args, r.stderr)
		}
	}
}

func TestHelpDescribesEveryCommandAndFlag(t *testing.T) {
	r := runCLI(t, Env{}, "help")
	if r.code != ExitOK {
		t.Fatalf("help exit %d", r.code)
	}
	for _, c := range commands() {
		if !strings.Contains(r.stdout, "  "+c.name+" ") {
			t.Errorf("help lacks %s:\n%s", c.name, r.stdout)
		}
		var env Env
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(fs, &env)
		h := runCLI(t, Env{}, c.name, "-h")
		if h.code != ExitOK {
			t.Errorf("%s -h exit %d", c.name, h.code)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(h.stdout, "-"+f.Name) || !strings.Contains(h.stdout, f.Usage) {
				t.Errorf("%s -h does not describe -%s:\n%s", c.name, f.Name, h.stdout)
			}
		})
		if hh := runCLI(t, Env{}, "help", c.name); hh.stdout != h.stdout {
			t.Errorf("'help %s' differs from '%s -h'", c.name, c.name)
		}
	}
	if r := runCLI(t, Env{}); r.code != ExitUsage || !strings.Contains(r.stdout, "commands:") {
		t.Errorf("no arguments: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestFabricWithoutRootPointsToBench(t *testing.T) {
	r := runCLI(t, Env{Euid: func() int { return 1000 }}, "fabric", "--hosts", "3")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "'ipoib bench'") || !strings.Contains(r.stderr, "root") {
		t.Fatalf("exit %d stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, Env{Euid: func() int { return 1000 }}, "bench", "--iperf")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "needs root") {
		t.Fatalf("bench --iperf without root: exit %d stderr %q", r.code, r.stderr)
	}
}

// TestSoakAndBenchRun: soak -h describes the soak's flags; bench without --iperf runs the in-process suite end to end
// with the flags' values (a small transfer per row).
func TestSoakAndBenchRun(t *testing.T) {
	if r := runCLI(t, Env{}, "soak", "-h"); r.code != ExitOK || !strings.Contains(r.stdout+r.stderr, "-unsafe-skip-drain") {
		t.Fatalf("soak -h: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r := runCLI(t, Env{}, "bench", "--bytes", "65536", "--mtu", "9000", "--runs", "1", "--json")
	if r.code != ExitOK {
		t.Fatalf("bench: exit %d stderr %q", r.code, r.stderr)
	}
	var rep struct {
		Bytes int64 `json:"bytes"`
		Runs  int   `json:"runs"`
		Rows  []struct {
			Link string `json:"link"`
			MTU  int    `json:"mtu"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, r.stdout)
	}
	mtus := map[int]bool{}
	for _, row := range rep.Rows {
		mtus[row.MTU] = true
	}
	if rep.Runs != 1 || len(rep.Rows) == 0 || !mtus[9000] || !mtus[defaultDatagramMTU] {
		t.Fatalf("bench report does not follow the flags: %+v", rep)
	}
}

// fakeEndpoint is a control.Endpoint with a settable mode.
type fakeEndpoint struct {
	mu   sync.Mutex
	info control.InterfaceInfo
}

func (f *fakeEndpoint) Info() control.InterfaceInfo { f.mu.Lock(); defer f.mu.Unlock(); return f.info }
func (f *fakeEndpoint) Stats() any {
	return map[string]any{"Counters": map[string]int{"rx_packets": 5, "tx_packets": 6}, "Drops": map[string]int{"rx_own_echo": 1}}
}
func (f *fakeEndpoint) SetMode(m string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.info.Mode = m
	return nil
}

func TestShowAndModeOverControlSocket(t *testing.T) {
	dir := t.TempDir()
	h1 := &fakeEndpoint{info: control.InterfaceInfo{Host: "ipoib-h1", Name: "ib0", Mode: "connected", MTU: 65520, LinkUp: true}}
	h2 := &fakeEndpoint{info: control.InterfaceInfo{Host: "ipoib-h2", Name: "ib0", Mode: "connected", MTU: 65520}}
	srv, err := control.Listen(dir, []control.Endpoint{h1, h2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	env := Env{ControlDir: dir}

	r := runCLI(t, env, "show")
	if r.code != ExitOK || !strings.Contains(r.stdout, "ipoib-h1: ib0: <UP> mode connected mtu 65520") ||
		!strings.Contains(r.stdout, "ipoib-h2: ib0: <DOWN>") || !strings.Contains(r.stdout, "rx_own_echo: 1") {
		t.Fatalf("show: exit %d stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "show", "--json", "--host", "ipoib-h2")
	var got []control.InterfaceStats
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 || got[0].Interface.Host != "ipoib-h2" {
		t.Fatalf("show --json: %v %+v (%s)", err, got, r.stdout)
	}
	if r := runCLI(t, env, "show", "--host", "ipoib-h7"); r.code != ExitFail || !strings.Contains(r.stderr, "no such host") {
		t.Fatalf("show unknown host: exit %d stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, env, "mode", "datagram", "--host", "ipoib-h2")
	if r.code != ExitOK || r.stdout != "ipoib-h2: ib0: mode datagram mtu 65520\n" {
		t.Fatalf("mode: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if h2.Info().Mode != "datagram" || h1.Info().Mode != "connected" {
		t.Fatal("mode switch reached the wrong host")
	}
	if r := runCLI(t, env, "mode", "datagram"); r.code != ExitOK || h1.Info().Mode != "datagram" || h2.Info().Mode != "datagram" {
		t.Fatalf("mode without host on a 2-host process: exit %d stderr %q, modes %s %s", r.code, r.stderr, h1.Info().Mode, h2.Info().Mode)
	}
	if r := runCLI(t, Env{ControlDir: t.TempDir()}, "show"); r.code != ExitFail || !strings.Contains(r.stderr, "no running ipoib process") {
		t.Fatalf("show with nothing running: exit %d stderr %q", r.code, r.stderr)
	}
}

// countingEndpoint's rx_packets grow by 100 per snapshot, so --watch has
// a rate to show.
type countingEndpoint struct {
	info control.InterfaceInfo
	mu   sync.Mutex
	n    int
}

func (c *countingEndpoint) Info() control.InterfaceInfo { return c.info }
func (c *countingEndpoint) Stats() any {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += 100
	return map[string]any{"counters": map[string]int{"rx_packets": c.n}, "tx_conns": []any{}, "rx_conns": []any{}}
}
func (c *countingEndpoint) SetMode(string) error { return nil }

func TestShowBriefAndWatch(t *testing.T) {
	dir := t.TempDir()
	var eps []control.Endpoint
	for _, h := range []string{"ipoib-h10", "ipoib-h2", "ipoib-h1"} {
		eps = append(eps, &countingEndpoint{info: control.InterfaceInfo{Host: h, Name: "ib0", Mode: "connected", MTU: 65520, LinkUp: true}})
	}
	srv, err := control.Listen(dir, eps, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	env := Env{ControlDir: dir}

	r := runCLI(t, env, "show", "--brief")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != ExitOK || len(lines) != 4 || !strings.HasPrefix(lines[1], "ipoib-h1 ") ||
		!strings.HasPrefix(lines[2], "ipoib-h2 ") || !strings.HasPrefix(lines[3], "ipoib-h10 ") {
		t.Fatalf("show --brief: exit %d stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}

	r = runCLI(t, env, "show", "--watch", "--interval", "20ms", "--count", "2", "--host", "ipoib-h2")
	if r.code != ExitOK {
		t.Fatalf("show --watch: exit %d stderr %q", r.code, r.stderr)
	}
	var rates int
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		if len(f) == 9 && f[0] == "ipoib-h2" {
			rates++
			if f[3] == "-" || f[3] == "0.0" {
				t.Errorf("no RX rate in %q", l)
			}
		}
	}
	if rates != 2 {
		t.Fatalf("want 2 rate lines, got %d:\n%s", rates, r.stdout)
	}
	for _, args := range [][]string{{"show", "--watch", "--json"}, {"show", "--watch", "--interval", "1ms"}, {"show", "--count", "-1"}} {
		if r := runCLI(t, env, args...); r.code != ExitUsage {
			t.Errorf("%v: exit %d", args, r.code)
		}
	}
}
