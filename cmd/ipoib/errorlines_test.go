package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// unprivileged is the nobody user, for commands run as a user that is not
// the owner of the running processes.
const unprivileged = 65534

// binaryFor copies the binary under test to a directory any user may
// enter, for running it as another uid (go test's build directory is
// root's alone).
func binaryFor(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(dir, "ipoib")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// runAs runs the binary at bin as uid with args and returns its result.
func runAs(t *testing.T, bin string, uid uint32, args ...string) binResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), runAsMainEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("%v as uid %d: %v", args, uid, err)
	}
	return binResult{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
}

// TestBinaryErrorLinesSayWhy: the lines of a command that cannot do what
// it was asked while a fabric runs say why and what to do, one line each:
// another user's show or mode is told it lacks permission (not that
// nothing runs), capture without --host lists the hosts, and a second
// fabric on the first one's namespace names names the first one's PID
// (from its namespace marker) and leaves the first alone; a namespace
// ipoib did not make is named as such.
func TestBinaryErrorLinesSayWhy(t *testing.T) {
	needRoot(t)
	const nsPrefix, foreign = "ipoib-t6e", "ipoib-t6n"
	tmp := t.TempDir()
	// Every directory above the control directory open to others, as
	// /run is: the control directory itself (0700) is what stops them.
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctl := filepath.Join(tmp, "ctl")
	checkGone(t, nsPrefix, ctl)
	fabric := func(prefix string) []string {
		return []string{"fabric", "--hosts", "2", "--netns-prefix", prefix, "--prefix", "10.77.96.0/24", "--control-dir", ctl}
	}
	fab := startDaemon(t, "stop with Ctrl-C", fabric(nsPrefix)...)
	bin := binaryFor(t, tmp)
	noAccess := fmt.Sprintf("control: permission denied: %s (uid 0's, mode 0700): the running processes' control sockets are their owner's; run as that user (sudo for root)", ctl)
	pcap := filepath.Join(tmp, "c.pcapng")
	if out, err := exec.Command("ip", "netns", "add", foreign+"1").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "delete", foreign+"1").Run()
	for _, tc := range []struct {
		uid  uint32
		args []string
		code int
		line string
	}{
		{unprivileged, []string{"show", "--control-dir", ctl}, 1, "ipoib show: " + noAccess},
		{unprivileged, []string{"show", "--brief", "--control-dir", ctl}, 1, "ipoib show: " + noAccess},
		{unprivileged, []string{"mode", "datagram", "--control-dir", ctl}, 1, "ipoib mode: " + noAccess},
		{unprivileged, []string{"capture", "--host", nsPrefix + "1", "-w", "-", "--control-dir", ctl}, 1, "ipoib capture: " + noAccess},
		{0, []string{"capture", "-w", pcap, "--control-dir", ctl}, 2, strings.TrimSuffix(usageLine("capture", "--host is required: 2 hosts run: ipoib-t6e1, ipoib-t6e2"), "\n")},
		{0, fabric(nsPrefix), 1, fmt.Sprintf("ipoib fabric: create netns %s1: file already exists (made by ipoib process %d, which is running); stop that process or give this run another --netns-prefix", nsPrefix, fab.cmd.Process.Pid)},
		{0, fabric(foreign), 1, fmt.Sprintf("ipoib fabric: create netns %s1: file already exists (no ipoib owner marker: not made by ipoib); remove it with 'ip netns delete %s1' or give this run another --netns-prefix", foreign, foreign)},
	} {
		r := runAs(t, bin, tc.uid, tc.args...)
		t.Logf("uid %-5d %-50s -> rc %d %s", tc.uid, strings.Join(tc.args, " "), r.code, strings.TrimSuffix(r.stderr, "\n"))
		if r.code != tc.code || r.stderr != tc.line+"\n" {
			t.Errorf("%v as uid %d: exit %d stderr\n%q\nwant exit %d, stderr\n%q", tc.args, tc.uid, r.code, r.stderr, tc.code, tc.line+"\n")
		}
	}
	if _, err := os.Stat(pcap); err == nil {
		t.Errorf("capture refused but created %s", pcap)
	}
	if left := netnsWithPrefix(t, foreign); len(left) != 1 {
		t.Errorf("namespaces %v; want only the foreign one, untouched", left)
	}
	// The first fabric is whole: its namespaces, and both hosts answer.
	if got := netnsWithPrefix(t, nsPrefix); len(got) != 2 {
		t.Errorf("the running fabric's namespaces: %v", got)
	}
	if r := runIpoib(t, "show", "--brief", "--control-dir", ctl); r.code != 0 || strings.Count(r.stdout, nsPrefix) != 2 {
		t.Errorf("show --brief as root: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if st := fab.stop(); st.ExitCode() != 0 {
		t.Errorf("fabric exit %d\n%s", st.ExitCode(), fab.output())
	}
	checkGone(t, nsPrefix, ctl)
}
