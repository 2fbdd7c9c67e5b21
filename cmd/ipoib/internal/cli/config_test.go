package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goodConfig is a complete file for 'ipoib up --config'; each bad case
// below changes one thing.
const goodConfig = `# ib0 on host 1
dev = "ipcfg0"
addr = "10.77.40.1/24"
bind = "127.0.0.1"
peers = ["127.0.0.2"]
allow = ["127.0.0.0/8"]
pkey-table = ["0x8001"]
mode = "connected"
ack-timeout = "20ms"
udp-offload = true
loss = 0
log-level = "info"

[[child]]
pkey = "0x8001"
addrs = ["10.77.41.1/24"]
`

// TestConfigBadFiles: each bad file is one error line naming the file,
// the line and the key, status 2, from both 'ipoib up --config' and
// 'ipoib config check', and nothing is created: no TAP, no control
// socket. The user is not root, so a file that wrongly passed would stop
// at the root check with a different line instead of creating anything.
func TestConfigBadFiles(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		line       int
		key, want  string
	}{
		{"unknown key", strings.Replace(goodConfig, "loss = 0", "bogus = 1", 1), 11, "bogus", "unknown key"},
		{"underscore spelling", strings.Replace(goodConfig, "loss = 0", "max_rx_conns = 5", 1), 11, "max_rx_conns", "did you mean max-rx-conns"},
		{"wrong type", strings.Replace(goodConfig, `mode = "connected"`, "mtu = \"big\"", 1), 8, "mtu", "want an integer, got a string"},
		{"wrong list type", strings.Replace(goodConfig, `peers = ["127.0.0.2"]`, "peers = [2]", 1), 5, "peers", "want an array of strings"},
		{"bad CIDR", strings.Replace(goodConfig, `addr = "10.77.40.1/24"`, `addr = "10.77.40.1"`, 1), 3, "addr", "want an IP prefix"},
		{"bad allow CIDR", strings.Replace(goodConfig, `allow = ["127.0.0.0/8"]`, `allow = ["127.0.0.0/33"]`, 1), 6, "allow", "not an IP prefix"},
		{"bad P_Key", strings.Replace(goodConfig, `pkey-table = ["0x8001"]`, `pkey-table = ["0x18001"]`, 1), 7, "pkey-table", "want a P_Key"},
		{"child P_Key invalid", strings.Replace(goodConfig, `pkey = "0x8001"`, `pkey = "0x8000"`, 1), 15, "child[1].pkey", "not partitions"},
		{"duplicate child", goodConfig + "\n[[child]]\npkey = \"0x0001\"\n", 19, "child[2].pkey", "also the child at line 14"},
		{"child not in table", strings.Replace(goodConfig, `pkey = "0x8001"`, `pkey = "0x8002"`, 1), 14, "child[1].pkey", "not in the port's P_Key table"},
		{"child unknown key", strings.Replace(goodConfig, `addrs = [`, `adrs = [`, 1), 16, "child[1].adrs", "unknown key"},
		{"child missing pkey", strings.Replace(goodConfig, `pkey = "0x8001"`+"\n", "", 1), 14, "child[1]", "missing required key pkey"},
		{"missing required key", strings.Replace(goodConfig, `bind = "127.0.0.1"`+"\n", "", 1), 1, "bind", "missing required key"},
		{"wrong family", strings.Replace(goodConfig, `peers = ["127.0.0.2"]`, `peers = ["::1"]`, 1), 5, "peers", "not an IP address of --bind's family"},
		{"bad duration", strings.Replace(goodConfig, `"20ms"`, `"fast"`, 1), 9, "ack-timeout", "want a duration"},
		{"bad log level", strings.Replace(goodConfig, `"info"`, `"loud"`, 1), 12, "log-level", "loud"},
		{"bad mode", strings.Replace(goodConfig, `"connected"`, `"turbo"`, 1), 8, "mode", "want connected or datagram"},
		{"duplicate key", goodConfig[:strings.Index(goodConfig, "[[child]]")] + "mode = \"datagram\"\n", 14, "mode", "already defined"},
		{"syntax", strings.Replace(goodConfig, `dev = "ipcfg0"`, `dev = ipcfg0`, 1), 2, "", "expected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ib0.conf")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			ctl := filepath.Join(dir, "ctl")
			for _, args := range [][]string{{"up", "--config", path, "--control-dir", ctl}, {"config", "check", path}} {
				var out, errb bytes.Buffer
				env := Env{Stdout: &out, Stderr: &errb, Euid: func() int { return 1000 }, ControlDir: ctl}
				code := Main(context.Background(), args, env)
				stderr := errb.String()
				lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
				where := fmt.Sprintf("%s:%d: ", path, tc.line)
				if tc.key != "" {
					where += tc.key + ": "
				}
				if code != ExitUsage || len(lines) != 1 || !strings.Contains(stderr, where) || !strings.Contains(stderr, tc.want) {
					t.Errorf("%v: exit %d, stderr %q; want 2 and one line with %q and %q", args[:2], code, stderr, where, tc.want)
				}
			}
			if _, err := os.Stat(ctl); !os.IsNotExist(err) {
				t.Errorf("control directory %s was created", ctl)
			}
			if _, err := os.Stat("/sys/class/net/ipcfg0"); !os.IsNotExist(err) {
				t.Error("TAP ipcfg0 exists")
			}
		})
	}
}

// TestConfigCheckGood: the good file passes 'ipoib config check', and
// flags on the command line override the file's values.
func TestConfigCheckGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ib0.conf")
	if err := os.WriteFile(path, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb, Euid: func() int { return 1000 }}
	if code := Main(context.Background(), []string{"config", "check", path}, env); code != ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := path + ": ok: ipcfg0 10.77.40.1/24 bind 127.0.0.1:4791 mode connected, 1 peers, children [ipcfg0.8001]\n"
	if out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
	// A flag beats the file: --mode datagram over mode = "connected"; a
	// bad flag is the flag's error, not the file's.
	errb.Reset()
	code := Main(context.Background(), []string{"up", "--config", path, "--mode", "turbo"}, env)
	if code != ExitUsage || !strings.Contains(errb.String(), `--mode "turbo"`) || strings.Contains(errb.String(), path) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	code = Main(context.Background(), []string{"up", "--config", path, "--mode", "datagram", "--mtu", "9000"}, env)
	if code != ExitUsage || !strings.Contains(errb.String(), "--mtu 9000") {
		t.Fatalf("datagram mode from the flag not applied: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	code = Main(context.Background(), []string{"up", "--config", path, "--mode", "datagram"}, env)
	if code != ExitUsage || !strings.Contains(errb.String(), "needs root") {
		t.Fatalf("a good file with a good flag: exit %d, stderr %q; want the root check", code, errb.String())
	}
	errb.Reset()
	code = Main(context.Background(), []string{"up", "--config", filepath.Join(t.TempDir(), "none.conf")}, env)
	if code != ExitUsage || !strings.Contains(errb.String(), "no such file") {
		t.Fatalf("a missing file: exit %d, stderr %q", code, errb.String())
	}
}
