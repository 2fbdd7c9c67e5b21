package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// notifySocket is a service manager's end of the readiness protocol: a
// real unix datagram socket, as systemd makes for a Type=notify unit.
type notifySocket struct {
	path string
	msgs chan string
}

func listenNotify(t *testing.T, path string) *notifySocket {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{path: path, msgs: make(chan string, 64)}
	go func() {
		defer close(n.msgs)
		b := make([]byte, 4096)
		for {
			k, err := c.Read(b)
			if err != nil {
				return
			}
			n.msgs <- string(b[:k])
		}
	}()
	t.Cleanup(func() { c.Close() })
	return n
}

// await reads datagrams until one contains want, and returns it.
func (n *notifySocket) await(t *testing.T, want string, within time.Duration) string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket %s closed before %q", n.path, want)
			}
			if strings.Contains(m, want) {
				return m
			}
		case <-timeout:
			t.Fatalf("no %q on %s within %v", want, n.path, within)
		}
	}
}

// serviceHost is one 'ipoib up --config' in its namespace.
type serviceHost struct {
	ns, conf, ctl string
	notify        *notifySocket
	cmd           *exec.Cmd
	log           *os.File
}

const serviceConf = `# written by TestBinaryServiceE2E
dev = "ib0"
addr = "10.77.62.%[1]d/24"
bind = "10.98.62.%[1]d"
peers = ["10.98.62.%[2]d"]
pkey-table = ["0x8001"]
host = "svc%[1]d"
control-dir = "%[3]s"
log-level = "info"
`

const serviceChild = `
[[child]]
pkey = "0x8001"
addrs = ["10.77.63.%d/24"]
`

// TestBinaryServiceE2E is 'ipoib up' as a service, end to end: two
// processes in two namespaces over a veth pair, started from config
// files alone, each reporting READY=1 and a STATUS= line on a real
// notify socket; ping and an iperf3 stream over ib0; while the stream
// runs both files gain a P_Key child and are reloaded (one by 'ipoib
// reload', one by SIGHUP): the children come up and pass pings, the
// stream keeps going with no 1 s interval stalled and no connection
// re-made on ib0; 'ipoib down' stops both and leaves no TAP or socket.
func TestBinaryServiceE2E(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not in PATH: apt-get install iperf3")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	nss := []string{"ipoib-svc1", "ipoib-svc2"}
	for _, ns := range nss {
		exec.Command("ip", "netns", "delete", ns).Run()
	}
	t.Cleanup(func() {
		for _, ns := range nss {
			exec.Command("ip", "netns", "delete", ns).Run()
		}
	})
	for _, c := range [][]string{
		{"netns", "add", nss[0]}, {"netns", "add", nss[1]},
		{"-n", nss[0], "link", "set", "lo", "up"}, {"-n", nss[1], "link", "set", "lo", "up"},
		{"-n", nss[0], "link", "add", "vsvc1", "mtu", "9000", "type", "veth", "peer", "name", "vsvc2", "netns", nss[1], "mtu", "9000"},
		{"-n", nss[0], "addr", "add", "10.98.62.1/24", "dev", "vsvc1"}, {"-n", nss[1], "addr", "add", "10.98.62.2/24", "dev", "vsvc2"},
		{"-n", nss[0], "link", "set", "vsvc1", "up"}, {"-n", nss[1], "link", "set", "vsvc2", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	dir := t.TempDir()
	var hosts [2]*serviceHost
	for i := range 2 {
		h := &serviceHost{ns: nss[i], conf: filepath.Join(dir, fmt.Sprintf("ib0-%d.conf", i+1)), ctl: filepath.Join(dir, fmt.Sprintf("ctl%d", i+1))}
		if err := os.WriteFile(h.conf, fmt.Appendf(nil, serviceConf, i+1, 2-i, h.ctl), 0o644); err != nil {
			t.Fatal(err)
		}
		h.notify = listenNotify(t, filepath.Join(dir, fmt.Sprintf("notify%d", i+1)))
		if h.log, err = os.Create(filepath.Join(dir, fmt.Sprintf("up%d.log", i+1))); err != nil {
			t.Fatal(err)
		}
		// No flags: everything comes from the file.
		h.cmd = exec.Command("ip", "netns", "exec", h.ns, self, "up", "--config", h.conf)
		h.cmd.Env = append(os.Environ(), runAsMainEnv+"=1", "NOTIFY_SOCKET="+h.notify.path)
		h.cmd.Stdout, h.cmd.Stderr = h.log, h.log
		if err := h.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		hosts[i] = h
		t.Cleanup(func() {
			if h.cmd.ProcessState == nil {
				h.cmd.Process.Signal(syscall.SIGTERM)
				h.cmd.Wait()
			}
			if t.Failed() {
				b, _ := os.ReadFile(h.log.Name())
				t.Logf("%s log:\n%s", h.ns, b)
			}
		})
	}
	for i, h := range hosts {
		m := h.notify.await(t, "READY=1", 60*time.Second)
		if !strings.Contains(m, fmt.Sprintf("STATUS=ib0 10.77.62.%d/24 mode connected", i+1)) || !strings.Contains(m, "1 peers") {
			t.Fatalf("%s: readiness datagram %q lacks the STATUS line", h.ns, m)
		}
		if _, err := os.Stat(filepath.Join("/proc", fmt.Sprint(h.cmd.Process.Pid))); err != nil {
			t.Fatal(err)
		}
	}
	ping := func(ns, to string) {
		t.Helper()
		if out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-c", "2", "-W", "5", to).CombinedOutput(); err != nil {
			t.Fatalf("ping %s from %s: %v\n%s", to, ns, err, out)
		}
	}
	ping(nss[0], "10.77.62.2")
	ping(nss[1], "10.77.62.1")
	connects := func() [2]float64 {
		var n [2]float64
		for i, h := range hosts {
			_, st := hostStats(t, h.ctl, fmt.Sprintf("svc%d", i+1))
			n[i] = testutil.JSONNumber(t, st, "reaper", "tx_connects")
		}
		return n
	}
	before := connects()

	const seconds = 8
	var out strings.Builder
	cl := exec.Command("ip", "netns", "exec", nss[0], "iperf3", "-c", "10.77.62.2", "-t", fmt.Sprint(seconds), "-i", "1", "--forceflush", "-f", "m")
	pipe, err := cl.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The client starts once the server says it listens.
	srv := exec.Command("ip", "netns", "exec", nss[1], "iperf3", "-s", "-1", "-B", "10.77.62.2", "--forceflush")
	srvReady, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	sr := bufio.NewScanner(srvReady)
	for sr.Scan() && !strings.Contains(sr.Text(), "Server listening") {
	}
	go func() {
		for sr.Scan() {
		}
	}()
	if err := cl.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			lines <- sc.Text()
		}
	}()
	// Reload once two intervals have been reported.
	intervals := 0
	for l := range lines {
		if strings.Contains(l, "/sec") {
			if intervals++; intervals == 2 {
				break
			}
		}
	}
	// Both files gain a child; host 1's also a peer (a third host that
	// is not there yet: it joins the replication set and the default
	// allow list).
	write := func(h *serviceHost, i int, conf string) {
		t.Helper()
		if err := os.WriteFile(h.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	confs := [2]string{}
	for i, h := range hosts {
		confs[i] = fmt.Sprintf(serviceConf, i+1, 2-i, h.ctl) + fmt.Sprintf(serviceChild, i+1)
	}
	confs[0] = strings.Replace(confs[0], `peers = ["10.98.62.2"]`, `peers = ["10.98.62.2", "10.98.62.3"]`, 1)
	for i, h := range hosts {
		write(h, i, confs[i])
	}
	r := runIpoib(t, "reload", "--control-dir", hosts[0].ctl)
	if r.code != 0 || !strings.Contains(r.stdout, "svc1: reloaded: peers added [10.98.62.3]; allow [10.98.62.2/32 10.98.62.3/32 10.98.62.0/24]; child added ib0.8001\n") ||
		strings.Contains(r.stdout, "not applied") {
		t.Fatalf("ipoib reload: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if err := hosts[1].cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	hosts[1].notify.await(t, "RELOADING=1", 10*time.Second)
	if m := hosts[1].notify.await(t, "READY=1", 20*time.Second); !strings.Contains(m, "1 children") {
		t.Fatalf("after SIGHUP: %q, want STATUS with 1 children", m)
	}
	for range lines {
	}
	if clientErr := cl.Wait(); clientErr != nil {
		t.Fatalf("iperf3 client: %v\n%s", clientErr, out.String())
	}
	// Every 1 s interval carried data: the stream did not stall or drop
	// across the reloads.
	var rates []float64
	for _, l := range strings.Split(out.String(), "\n") {
		if !strings.Contains(l, "Mbits/sec") || strings.Contains(l, "sender") || strings.Contains(l, "receiver") {
			continue
		}
		f := strings.Fields(l[strings.Index(l, "sec")+3:])
		var mbit float64
		for k := range f {
			if f[k] == "Mbits/sec" && k > 0 {
				fmt.Sscan(f[k-1], &mbit)
			}
		}
		rates = append(rates, mbit)
	}
	if len(rates) < seconds {
		t.Fatalf("%d intervals, want %d:\n%s", len(rates), seconds, out.String())
	}
	sorted := slices.Clone(rates)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	for k, v := range rates {
		if v < median/10 {
			t.Fatalf("interval %d: %.0f Mbit/s, under a tenth of the median %.0f: the stream stalled across the reload\n%s", k, v, median, out.String())
		}
	}
	t.Logf("iperf3 over ib0 across the reloads: %v Mbit/s per second", rates)
	if after := connects(); after != before {
		t.Fatalf("ib0 tx_connects %v before the reloads, %v after: a connection was made again", before, after)
	}
	ping(nss[0], "10.77.63.2")
	ping(nss[1], "10.77.63.1")

	// A file with an error changes nothing and says where; a key that
	// cannot change live is named and left.
	write(hosts[0], 0, confs[0]+"mtu = \"big\"\n")
	r = runIpoib(t, "reload", "--control-dir", hosts[0].ctl)
	if r.code != 1 || !oneLine(r.stderr) || !strings.Contains(r.stderr, hosts[0].conf+":14: child[1].mtu: unknown key") || !strings.Contains(r.stderr, "nothing changed") {
		t.Fatalf("reload of a bad file: exit %d, stderr %q", r.code, r.stderr)
	}
	write(hosts[0], 0, strings.Replace(confs[0], `log-level = "info"`, "log-level = \"info\"\nmtu = 9000", 1))
	r = runIpoib(t, "reload", "--control-dir", hosts[0].ctl)
	if r.code != 0 || r.stdout != "svc1: reloaded: nothing changed\nsvc1: not applied, cannot change while running (restart to apply): mtu\n" {
		t.Fatalf("reload changing mtu: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if info, _ := hostStats(t, hosts[0].ctl, "svc1"); info.MTU != 65520 {
		t.Fatalf("mtu %d after a reload that cannot change it", info.MTU)
	}

	// show peers: host 1's ib0 has one peer, host 2, connected both
	// ways, heard from within the last seconds (the pings above), the
	// stream's bytes on its connections.
	r = runIpoib(t, "show", "peers", "--dev", "ib0", "--control-dir", hosts[0].ctl)
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(rows) != 2 {
		t.Fatalf("show peers: exit %d, stderr %q:\n%s", r.code, r.stderr, r.stdout)
	}
	f := strings.Fields(rows[1])
	// The IP column lists every address the neighbour was heard from: the
	// kernel may have resolved host 2's link-local by then too.
	if len(f) != 12 || !slices.Contains(strings.Split(f[3], ","), "10.77.62.2") || strings.Count(f[4], ":") != 19 || f[5] != "up" || f[6] != "live" || f[8] != "ago" || f[9] == "0" || f[10] == "0" {
		t.Fatalf("show peers row %q: want host 2 (10.77.62.2), a colon hardware address, up/live, a recent receive, bytes both ways\n%s", rows[1], r.stdout)
	}
	t.Logf("ipoib show peers:\n%s", r.stdout)
	r = runIpoib(t, "show", "-S", "--dev", "ib0", "--control-dir", hosts[0].ctl)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "svc1 ib0:\n") || !strings.Contains(r.stdout, "\n     reaper.tx_connects: ") || !strings.Contains(r.stdout, "\n     rocev2.rx_drops.garbage: 0\n") {
		t.Fatalf("show -S: exit %d:\n%s", r.code, r.stdout)
	}

	for i, h := range hosts {
		cmd := exec.Command("ip", "netns", "exec", h.ns, self, "down", "--control-dir", h.ctl)
		cmd.Env = append(os.Environ(), runAsMainEnv+"=1")
		b, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(b), fmt.Sprintf("svc%d: down", i+1)) || !strings.Contains(string(b), "TAPs ib0 ib0.8001") {
			t.Fatalf("ipoib down in %s: %v\n%s", h.ns, err, b)
		}
		h.notify.await(t, "STOPPING=1", 5*time.Second)
		if err := h.cmd.Wait(); err != nil {
			t.Fatalf("%s: up exited %v after down", h.ns, err)
		}
		for _, d := range []string{"ib0", "ib0.8001"} {
			if exec.Command("ip", "-n", h.ns, "link", "show", d).Run() == nil {
				t.Errorf("%s: %s left after down", h.ns, d)
			}
		}
		if socks, _ := filepath.Glob(filepath.Join(h.ctl, "*.sock")); len(socks) > 0 {
			t.Errorf("%s: sockets left after down: %v", h.ns, socks)
		}
	}
}

// TestBinaryCleanup: 'ipoib cleanup' removes a namespace whose marker
// names a process that is gone and a socket of a process that is gone,
// says so, and leaves an unmarked namespace alone; a second run finds
// nothing.
func TestBinaryCleanup(t *testing.T) {
	needRoot(t)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid := dead.Process.Pid
	marked, unmarked := "ipoib-clnt1", "ipoib-clnt2"
	for _, ns := range []string{marked, unmarked} {
		exec.Command("ip", "netns", "delete", ns).Run()
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v %s", ns, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	}
	markers, ctl := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(markers, marked), fmt.Appendf(nil, "ipoib-netns-owner v1\npid %d\nstart 1\n", pid), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(ctl, fmt.Sprintf("%d-1.sock", pid))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	r := runIpoib(t, "cleanup", "--control-dir", ctl, "--marker-dir", markers)
	want := fmt.Sprintf("removed namespace %s (its marker named a process that is gone)\nremoved socket %s\n", marked, sock)
	if r.code != 0 || r.stdout != want {
		t.Fatalf("cleanup: exit %d, stdout %q, stderr %q; want %q", r.code, r.stdout, r.stderr, want)
	}
	if _, err := os.Stat("/run/netns/" + marked); err == nil {
		t.Error("the marked namespace is still there")
	}
	if _, err := os.Stat("/run/netns/" + unmarked); err != nil {
		t.Errorf("the unmarked namespace was touched: %v", err)
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Error("the stale socket is still there")
	}
	r = runIpoib(t, "cleanup", "--control-dir", ctl, "--marker-dir", markers)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "nothing to remove") {
		t.Fatalf("second cleanup: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := runIpoib(t, "version"); r.code != 0 || !strings.Contains(r.stdout, "go: go1.") || !strings.Contains(r.stdout, "revision: ") {
		t.Fatalf("version: exit %d, stdout %q", r.code, r.stdout)
	}
}
