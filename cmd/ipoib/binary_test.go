package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/proc"
	"github.com/ipoibcm/ipoib/internal/testutil"
)

// The CLI tests run ipoib as a separate process: its own signals, pipes,
// exit status and /proc entry. The test binary is that process: with
// runAsMainEnv set, TestMain runs main() instead of the tests, so the
// binary under test is exactly this package's main, built once by go test
// (with -race when the tests have it).
const runAsMainEnv = "IPOIB_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsMainEnv) == "1" {
		os.Args = append([]string{"ipoib"}, os.Args[1:]...)
		main()
		return // main exits; not reached
	}
	os.Exit(m.Run())
}

// ipoibCmd is the ipoib binary with args. Cancelling ctx sends SIGINT
// (what Ctrl-C does), then SIGKILL after 20 s.
func ipoibCmd(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(os.Environ(), runAsMainEnv+"=1")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 20 * time.Second
	return cmd
}

type binResult struct {
	code           int
	stdout, stderr string
}

// runIpoib runs the binary to completion (at most 60 s).
func runIpoib(t *testing.T, args ...string) binResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := ipoibCmd(ctx, t, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
	default:
		t.Errorf("ipoib %v: %v (stderr %q)", args, err, short(errb.String()))
		return binResult{-1, out.String(), errb.String()}
	}
	return binResult{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
}

// short keeps a failure message readable when the binary dumped a stack.
func short(s string) string {
	if len(s) > 400 {
		return s[:400] + "..."
	}
	return s
}

// oneLine reports whether s is exactly one non-empty line.
func oneLine(s string) bool {
	return s != "" && strings.Count(s, "\n") == 1 && strings.HasSuffix(s, "\n")
}

func TestBinaryHelpAboutHelp(t *testing.T) {
	for _, args := range [][]string{{"help", "-h"}, {"help", "--help"}, {"help", "-help"}, {"help", "help"}, {"-h", "help"}} {
		r := runIpoib(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "commands:") || r.stderr != "" {
			t.Errorf("ipoib %v: exit %d stdout %q stderr %q; want the overview and 0", args, r.code, short(r.stdout), short(r.stderr))
		}
	}
	fab, help := runIpoib(t, "fabric", "-h"), runIpoib(t, "help", "fabric")
	if fab.code != 0 || help.stdout != fab.stdout || !strings.Contains(fab.stdout, "-hosts") {
		t.Errorf("'help fabric' (exit %d) differs from 'fabric -h' (exit %d)", help.code, fab.code)
	}
	if r := runIpoib(t, "help", "nosuch"); r.code != 2 || !oneLine(r.stderr) {
		t.Errorf("help nosuch: exit %d stderr %q", r.code, r.stderr)
	}
}

// netnsWithPrefix lists network namespaces whose name starts with prefix.
func netnsWithPrefix(t *testing.T, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// removeNetns deletes leftovers of a failed run so the next test starts
// clean.
func removeNetns(t *testing.T, names []string) {
	for _, n := range names {
		if out, err := exec.Command("ip", "netns", "delete", n).CombinedOutput(); err != nil {
			t.Logf("ip netns delete %s: %v %s", n, err, out)
		}
		os.Remove(filepath.Join("/run/ipoib/netns-owner", n))
	}
}

// TestBinarySoakWithoutTrafficFails: with every UD delivery lost no ARP
// is answered, nothing connects and nothing is delivered; that run tested
// nothing and must not PASS.
func TestBinarySoakWithoutTrafficFails(t *testing.T) {
	r := runIpoib(t, "soak", "--hosts", "2", "--duration", "300ms", "--ud-loss", "1", "--quiet")
	if r.code != 1 || !strings.Contains(r.stdout, "traffic_carried") || !strings.Contains(r.stdout, "FAIL") {
		t.Fatalf("soak with ud-loss 1: exit %d\n%s\nstderr %q", r.code, r.stdout, r.stderr)
	}
}

// daemon is a long-running ipoib (fabric, up) with stdout and stderr on
// one pipe, as under '2>&1 | tee log'.
type daemon struct {
	t     *testing.T
	cmd   *exec.Cmd
	r     *os.File
	lines chan string
	exit  chan struct{}
	mu    sync.Mutex
	log   strings.Builder
}

// startDaemon starts ipoib with args and waits for a log line containing
// ready.
func startDaemon(t *testing.T, ready string, args ...string) *daemon {
	t.Helper()
	return startDaemonCmd(t, ready, ipoibCmd(context.Background(), t, args...), args...)
}

// startDaemonCmd is startDaemon for a prepared command (one run through
// 'ip netns exec', say); args name it in failures.
func startDaemonCmd(t *testing.T, ready string, cmd *exec.Cmd, args ...string) *daemon {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, r: r, lines: make(chan string, 1024), exit: make(chan struct{})}
	d.cmd = cmd
	d.cmd.Stdout, d.cmd.Stderr = w, w
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		defer close(d.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			d.mu.Lock()
			d.log.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			select {
			case d.lines <- sc.Text():
			default:
			}
		}
	}()
	go func() { d.cmd.Wait(); close(d.exit) }()
	t.Cleanup(func() {
		select {
		case <-d.exit:
		default:
			d.stop()
		}
	})
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-d.lines:
			if !ok {
				<-d.exit
				t.Fatalf("ipoib %v exited before %q: %v\n%s", args, ready, d.cmd.ProcessState, d.output())
			}
			if strings.Contains(l, ready) {
				return d
			}
		case <-timeout:
			t.Fatalf("ipoib %v: no %q within 60 s\n%s", args, ready, d.output())
		}
	}
}

func (d *daemon) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// waitLog waits up to 10 s for a log line containing s; the log is read
// as it comes, so the wait ends with the line, not with a timer.
func (d *daemon) waitLog(s string) bool {
	timeout := time.After(10 * time.Second)
	for !strings.Contains(d.output(), s) {
		select {
		case _, ok := <-d.lines:
			if !ok {
				return strings.Contains(d.output(), s)
			}
		case <-timeout:
			return false
		}
	}
	return true
}

// closeLog closes the read end of the pipe, as tee does when it exits:
// every later write of the daemon's fails with EPIPE.
func (d *daemon) closeLog() { d.r.Close() }

// stop sends SIGINT (Ctrl-C) and waits for the exit.
func (d *daemon) stop() *os.ProcessState {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		d.t.Errorf("SIGINT: %v", err)
	}
	select {
	case <-d.exit:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.exit
		d.t.Errorf("ipoib did not stop within 30 s of SIGINT\n%s", d.output())
	}
	return d.cmd.ProcessState
}

func needRoot(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip not in PATH: apt-get install iproute2")
	}
}

// needPing is needRoot for the tests that ping across ib0.
func needPing(t *testing.T) {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("ping not in PATH: apt-get install iputils-ping")
	}
}

// freeUDPPort finds a UDP port free on addr.
func freeUDPPort(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return fmt.Sprint(c.LocalAddr().(*net.UDPAddr).Port)
}

// checkGone fails the test for every namespace, marker, socket or device
// the run left behind, and removes the namespaces.
func checkGone(t *testing.T, nsPrefix, ctl string, devs ...string) {
	t.Helper()
	if left := netnsWithPrefix(t, nsPrefix); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
		removeNetns(t, left)
	}
	markers, _ := filepath.Glob(filepath.Join("/run/ipoib/netns-owner", nsPrefix+"*"))
	if len(markers) > 0 {
		t.Errorf("namespace markers left behind: %v", markers)
		for _, m := range markers {
			os.Remove(m)
		}
	}
	socks, _ := filepath.Glob(filepath.Join(ctl, "*.sock"))
	if len(socks) > 0 {
		t.Errorf("control sockets left behind: %v", socks)
	}
	for _, d := range devs {
		if _, err := os.Stat(filepath.Join("/sys/class/net", d)); err == nil {
			t.Errorf("device %s left behind", d)
			exec.Command("ip", "link", "delete", d).Run()
		}
	}
}

// TestBinaryBrokenLogPipe: 'ipoib fabric 2>&1 | tee log', then Ctrl-C.
// tee exits first; the next log line used to kill ipoib with SIGPIPE and
// leave its namespaces, markers and control socket behind. The same for
// 'up' and its TAP.
func TestBinaryBrokenLogPipe(t *testing.T) {
	needRoot(t)
	const nsPrefix = "ipoib-t12p"
	ctl := t.TempDir()
	checkGone(t, nsPrefix, ctl, "t12p0")
	for _, args := range [][]string{
		{"fabric", "--hosts", "2", "--netns-prefix", nsPrefix, "--prefix", "10.77.98.0/24", "--control-dir", ctl},
		{"up", "--dev", "t12p0", "--addr", "10.77.97.1/24", "--bind", "127.0.0.1", "--port", freeUDPPort(t, "127.0.0.1"), "--control-dir", ctl},
	} {
		d := startDaemon(t, "stop with Ctrl-C", args...)
		d.closeLog()
		st := d.stop()
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Errorf("ipoib %s killed by %v after its log pipe closed", args[0], ws.Signal())
		} else if st.ExitCode() != 0 {
			t.Errorf("ipoib %s: exit %d after Ctrl-C", args[0], st.ExitCode())
		}
		checkGone(t, nsPrefix, ctl, "t12p0")
	}
}

// TestBinaryStaleControlSockets: sockets of a process that is gone, and of
// a pid now used by another process (this one, with another start time),
// are removed by the next 'show' instead of being dialled.
func TestBinaryStaleControlSockets(t *testing.T) {
	ctl := t.TempDir()
	if err := os.Chmod(ctl, 0o700); err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	stale := []string{
		control.SocketPath(ctl, dead.Process.Pid, 1),                 // process gone
		control.SocketPath(ctl, os.Getpid(), start+1000),             // pid reused by this test
		filepath.Join(ctl, fmt.Sprintf("%d.sock", dead.Process.Pid)), // an older ipoib's name
	}
	for _, p := range stale {
		// A socket file nobody listens on, as a killed process leaves.
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	r := runIpoib(t, "show", "--control-dir", ctl)
	if r.code != 1 || !strings.Contains(r.stderr, "no running ipoib process") || !oneLine(r.stderr) {
		t.Errorf("show over stale sockets: exit %d stderr %q", r.code, short(r.stderr))
	}
	for _, p := range stale {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("stale socket %s not removed", filepath.Base(p))
		}
	}
}

// failingEndpoint refuses every mode switch after the first call.
type failingEndpoint struct {
	mu   sync.Mutex
	info control.InterfaceInfo
}

func (f *failingEndpoint) Info() control.InterfaceInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info
}
func (f *failingEndpoint) Stats() any { return map[string]any{} }
func (f *failingEndpoint) SetMode(m string) error {
	if f.info.Host == "refuses" {
		return errors.New("refused by the test")
	}
	f.mu.Lock()
	f.info.Mode = m
	f.mu.Unlock()
	return nil
}

// listModes is host -> mode of every interface in ctl.
func listModes(t *testing.T, ctl string) map[string]string {
	t.Helper()
	resps, err := control.QueryAll(ctl, control.Request{Op: control.OpList}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]string{}
	for _, r := range resps {
		for _, i := range r.Interfaces {
			modes[i.Host] = i.Mode
		}
	}
	return modes
}

// TestBinaryModeSwitchesAllOrNothing: the README's 'ipoib mode datagram'
// with a 2-host fabric and an 'up' running switches all three; when one
// interface refuses, none is left switched, in any process.
func TestBinaryModeSwitchesAllOrNothing(t *testing.T) {
	needRoot(t)
	const nsPrefix = "ipoib-t12m"
	ctl := t.TempDir()
	checkGone(t, nsPrefix, ctl, "t12m0")
	fab := startDaemon(t, "stop with Ctrl-C", "fabric", "--hosts", "2", "--netns-prefix", nsPrefix, "--prefix", "10.77.96.0/24", "--control-dir", ctl)
	up := startDaemon(t, "stop with Ctrl-C", "up", "--dev", "t12m0", "--addr", "10.77.95.1/24", "--bind", "127.0.0.1",
		"--port", freeUDPPort(t, "127.0.0.1"), "--control-dir", ctl, "--host", "up1")

	r := runIpoib(t, "mode", "datagram", "--control-dir", ctl)
	if r.code != 0 || strings.Count(r.stdout, "mode datagram mtu 4092") != 3 {
		t.Fatalf("mode datagram: exit %d stdout %q stderr %q", r.code, r.stdout, short(r.stderr))
	}
	want := map[string]string{nsPrefix + "1": "datagram", nsPrefix + "2": "datagram", "up1": "datagram"}
	if got := listModes(t, ctl); !maps.Equal(got, want) {
		t.Fatalf("after mode datagram: %v, want %v", got, want)
	}

	// A third process (this test) whose second interface refuses: the
	// switch must leave every interface of every process in datagram.
	ok := &failingEndpoint{info: control.InterfaceInfo{Host: "accepts", Name: "ib0", Mode: "datagram"}}
	bad := &failingEndpoint{info: control.InterfaceInfo{Host: "refuses", Name: "ib0", Mode: "datagram"}}
	srv, err := control.Listen(ctl, []control.Endpoint{ok, bad}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r = runIpoib(t, "mode", "connected", "--control-dir", ctl)
	srv.Close()
	if r.code != 1 || !oneLine(r.stderr) || !strings.Contains(r.stderr, "refused by the test") {
		t.Errorf("mode connected with one refusing: exit %d stderr %q", r.code, short(r.stderr))
	}
	want["accepts"], want["refuses"] = "datagram", "datagram"
	got := listModes(t, ctl)
	got["accepts"], got["refuses"] = ok.Info().Mode, bad.Info().Mode
	if !maps.Equal(got, want) {
		t.Errorf("after a refused switch: %v, want every interface still datagram", got)
	}
	for _, d := range []*daemon{up, fab} {
		if st := d.stop(); st.ExitCode() != 0 {
			t.Errorf("exit %d\n%s", st.ExitCode(), d.output())
		}
	}
	checkGone(t, nsPrefix, ctl, "t12m0")
}

// TestBinaryCommandsDoc: docs/commands.md's flag reference is 'ipoib <cmd> -h'
// of every command 'ipoib help' lists, and README's command table has a
// row for each. IPOIB_UPDATE_DOCS=1 rewrites the flag reference.
func TestBinaryCommandsDoc(t *testing.T) {
	const begin, end = "<!-- commands:begin (generated from ipoib <cmd> -h) -->\n", "<!-- commands:end -->"
	names := helpCommands(t)
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(names, "help") {
		if !bytes.Contains(readme, []byte("| `ipoib "+c)) {
			t.Errorf("README.md's command table has no row for 'ipoib %s' (a line: | `ipoib %s ...` | what it does |)", c, c)
		}
	}
	path := filepath.Join("..", "..", "docs", "commands.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(b, []byte(begin)), bytes.Index(b, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("docs/commands.md has no %q ... %q section", begin, end)
	}
	var gen strings.Builder
	for k, c := range names {
		r := runIpoib(t, c, "-h")
		if r.code != 0 {
			t.Fatalf("%s -h: exit %d", c, r.code)
		}
		if k > 0 {
			gen.WriteString("\n")
		}
		fmt.Fprintf(&gen, "### ipoib %s\n\n```\n%s```\n", c, r.stdout)
	}
	got := string(b[i+len(begin) : j])
	if got == gen.String() {
		return
	}
	if os.Getenv("IPOIB_UPDATE_DOCS") == "1" {
		out := append(append(append([]byte{}, b[:i+len(begin)]...), gen.String()...), b[j:]...)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/commands.md's flag reference differs from 'ipoib <cmd> -h'; run IPOIB_UPDATE_DOCS=1 go test -run TestBinaryCommandsDoc ./cmd/ipoib")
}

// helpCommands returns the commands 'ipoib help' lists, in its order,
// help itself left out.
func helpCommands(t *testing.T) []string {
	t.Helper()
	r := runIpoib(t, "help")
	if r.code != 0 {
		t.Fatalf("help: exit %d", r.code)
	}
	_, list, ok := strings.Cut(r.stdout, "commands:\n")
	if !ok {
		t.Fatalf("'ipoib help' has no commands list:\n%s", r.stdout)
	}
	list, _, _ = strings.Cut(list, "\n\n")
	var names []string
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "help" {
			continue
		}
		names = append(names, f[0])
	}
	if len(names) < 8 {
		t.Fatalf("'ipoib help' lists %d commands, want at least the 8 there are: %q", len(names), names)
	}
	return names
}

// TestBinaryUpRefusesUnderlayTooSmall: with a 1500-byte underlay a 4096
// IB MTU is a black hole for every large packet; 'up' refuses it at
// start-up, naming the IB MTU that fits, and starts with that one.
func TestBinaryUpRefusesUnderlayTooSmall(t *testing.T) {
	needRoot(t)
	const ns = "ipoib-t12u"
	exec.Command("ip", "netns", "delete", ns).Run()
	for _, c := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "v0", "mtu", "1500", "type", "veth", "peer", "name", "v1", "mtu", "1500"},
		{"-n", ns, "addr", "add", "192.0.2.1/24", "dev", "v0"},
		{"-n", ns, "link", "set", "v0", "up"},
		{"-n", ns, "link", "set", "v1", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctl := t.TempDir()
	// Before the check, 'up' ran on into the black hole: the context
	// bounds that run.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up := func(ibMTU string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, self, "up", "--addr", "10.77.0.1/24", "--bind", "192.0.2.1",
			"--peers", "192.0.2.2", "--ib-mtu", ibMTU, "--control-dir", ctl)
		cmd.Env = append(os.Environ(), runAsMainEnv+"=1")
		return cmd
	}
	var errb bytes.Buffer
	cmd := up("4096")
	cmd.Stderr = &errb
	err = cmd.Run()
	if cmd.ProcessState.ExitCode() != 2 || !oneLine(errb.String()) || !strings.Contains(errb.String(), "carries 1500-byte packets") ||
		!strings.Contains(errb.String(), "use --ib-mtu 1024") {
		t.Fatalf("up --ib-mtu 4096 over 1500: %v, stderr %q; want exit 2 and one line naming --ib-mtu 1024", err, short(errb.String()))
	}
	// 1024 fits: it starts (and is stopped once ready).
	ok := up("1024")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ok.Stderr = w
	if err := ok.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	sc := bufio.NewScanner(r)
	ready := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "stop with Ctrl-C") {
			ready = true
			break
		}
	}
	ok.Process.Signal(syscall.SIGINT)
	go io.Copy(io.Discard, r)
	ok.Wait()
	if !ready || ok.ProcessState.ExitCode() != 0 {
		t.Fatalf("up --ib-mtu 1024 over 1500: ready %v, exit %d", ready, ok.ProcessState.ExitCode())
	}
}

// showInterfaces is 'ipoib show --json' of ctl, by host.
func showInterfaces(t *testing.T, ctl string) map[string]control.InterfaceInfo {
	t.Helper()
	r := runIpoib(t, "show", "--json", "--control-dir", ctl)
	var all []control.InterfaceStats
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		t.Fatalf("show --json: exit %d, %v: %s", r.code, err, short(r.stdout+r.stderr))
	}
	m := map[string]control.InterfaceInfo{}
	for _, s := range all {
		m[s.Interface.Host] = s.Interface
	}
	return m
}

// waitShow waits (up to 10 s) until show's view of host satisfies cond:
// the netlink event travels from the kernel to the engine asynchronously.
func waitShow(t *testing.T, ctl, host, what string, cond func(control.InterfaceInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info := showInterfaces(t, ctl)[host]
		if cond(info) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: show never reported %s; last %+v", host, what, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ipIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %v: %v %s", ns, args, err, out)
	}
}

// TestBinaryShowFollowsTheHost: what the host does to ib0 shows, and the
// engine follows it: an MTU within the mode's limit is taken and one
// above it is refused with a note; extra addresses are listed; a new MAC
// is followed (a ping to the host works after it: the replies reach the
// new MAC); a host that sets ib0 down shows DOWN.
func TestBinaryShowFollowsTheHost(t *testing.T) {
	needPing(t)
	const nsPrefix = "ipoib-t12s"
	h1, h2 := nsPrefix+"1", nsPrefix+"2"
	ctl := t.TempDir()
	checkGone(t, nsPrefix, ctl)
	fab := startDaemon(t, "stop with Ctrl-C", "fabric", "--hosts", "2", "--netns-prefix", nsPrefix, "--prefix", "10.77.94.0/24",
		"--control-dir", ctl, "--log-level", "debug")
	ping := func(from, to string) error {
		return exec.Command("ip", "netns", "exec", from, "ping", "-c", "1", "-W", "5", to).Run()
	}
	if err := ping(h1, "10.77.94.2"); err != nil {
		t.Fatalf("ping before any change: %v", err)
	}
	// CM and neighbour events are in the debug log (the connection is
	// made before the ping's reply is back, the neighbour learnt before).
	for _, want := range []string{`msg="CM REQ"`, `msg="CM TX event"`, `msg=neighbour`} {
		if !fab.waitLog(want) {
			t.Errorf("debug log lacks %s", want)
		}
	}

	ipIn(t, h2, "link", "set", "ib0", "mtu", "9000")
	waitShow(t, ctl, h2, "mtu 9000", func(i control.InterfaceInfo) bool { return i.MTU == 9000 && len(i.Notes) == 0 })

	ipIn(t, h2, "addr", "add", "10.77.93.2/24", "dev", "ib0")
	waitShow(t, ctl, h2, "both addresses", func(i control.InterfaceInfo) bool {
		return slices.Contains(i.Addrs, "10.77.94.2/24") && slices.Contains(i.Addrs, "10.77.93.2/24")
	})

	ipIn(t, h2, "link", "set", "ib0", "address", "02:12:34:56:78:9a")
	// The host's ARP cache on h1 still maps 10.77.94.2 to h2's engine
	// MAC, which did not change; the frames h2 receives must carry its
	// new MAC or its kernel drops them.
	if err := ping(h1, "10.77.94.2"); err != nil {
		t.Errorf("ping after the host changed its MAC: %v\n%s", err, fab.output())
	}

	r := runIpoib(t, "mode", "datagram", "--host", h2, "--control-dir", ctl)
	if r.code != 0 {
		t.Fatalf("mode datagram: %d %s", r.code, short(r.stderr))
	}
	ipIn(t, h2, "link", "set", "ib0", "mtu", "9000")
	waitShow(t, ctl, h2, "a note refusing 9000 in datagram mode", func(i control.InterfaceInfo) bool {
		return i.MTU == 4092 && len(i.Notes) == 1 && strings.Contains(i.Notes[0], "host set MTU 9000")
	})
	if text := runIpoib(t, "show", "--host", h2, "--control-dir", ctl); !strings.Contains(text.stdout, "note: ") {
		t.Errorf("show text lacks the note:\n%s", text.stdout)
	}

	ipIn(t, h2, "link", "set", "ib0", "down")
	waitShow(t, ctl, h2, "DOWN", func(i control.InterfaceInfo) bool { return !i.LinkUp })
	if text := runIpoib(t, "show", "--host", h2, "--control-dir", ctl); !strings.Contains(text.stdout, "<DOWN>") {
		t.Errorf("show text after link down:\n%s", text.stdout)
	}
	if st := fab.stop(); st.ExitCode() != 0 {
		t.Errorf("fabric exit %d", st.ExitCode())
	}
	checkGone(t, nsPrefix, ctl)
}
