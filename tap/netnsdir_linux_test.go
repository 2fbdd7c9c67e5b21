package tap

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// freshRunNetnsEnv tells a re-executed test binary that it runs in its
// own mount namespace and may mount over /run.
const freshRunNetnsEnv = "IPOIB_TAP_TEST_FRESH_RUN_NETNS"

// TestNetnsOnFreshRunNetnsSurvivesIPNetnsAdd reproduces a freshly booted
// machine, where /run/netns is a plain directory and not yet a mount
// point, and an `ip netns add` that runs while one of our namespaces
// exists. The mount games happen in a private mount namespace (the test
// binary re-executed with CLONE_NEWNS, / made private by the runtime), so
// the machine's own /run/netns is never touched.
func TestNetnsOnFreshRunNetnsSurvivesIPNetnsAdd(t *testing.T) {
	requireRoot(t)
	if os.Getenv(freshRunNetnsEnv) == "1" {
		freshRunNetnsChild(t)
		return
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) from iproute2")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNetnsOnFreshRunNetnsSurvivesIPNetnsAdd$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), freshRunNetnsEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("child in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestNetnsOnFreshRunNetnsSurvivesIPNetnsAdd") {
		t.Fatal("child did not run the test body")
	}
}

func freshRunNetnsChild(t *testing.T) {
	o := testOwner(t)

	// Sequential: ours, then ip's, then delete ours.
	freshNetnsDir(t)
	ours, err := o.Create("ipoibt-fresh-ours")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ipNetnsAdd(t, "ipoibt-fresh-ip")
	derr := ours.Delete()
	ipNetnsDelete(t, "ipoibt-fresh-ip")
	if derr != nil {
		t.Fatalf("delete ours after an ip netns add: %v", derr)
	}
	files, below, shared := netnsDirState(t)
	t.Logf("sequential: after both deletes %d files in %s, %d mounts below it, shared mount point %v", files, netnsDir, below, shared)
	if files != 0 || below != 0 || !shared {
		t.Fatalf("want 0 files, 0 mounts below, a shared mount point")
	}
	assertNetnsGone(t, o, "ipoibt-fresh-ours")

	// Concurrent: both prepare a fresh directory at the same time.
	const rounds = 20
	for i := range rounds {
		freshNetnsDir(t)
		ipDone := make(chan error, 1)
		ip := exec.Command("ip", "netns", "add", "ipoibt-fresh-ip")
		if err := ip.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { ipDone <- ip.Wait() }()
		ours, err := o.Create("ipoibt-fresh-ours")
		if err := <-ipDone; err != nil {
			t.Fatalf("round %d: ip netns add: %v", i, err)
		}
		if err != nil {
			t.Fatalf("round %d: create: %v", i, err)
		}
		derr := ours.Delete()
		ipNetnsDelete(t, "ipoibt-fresh-ip")
		if derr != nil {
			t.Fatalf("round %d: delete ours beside a concurrent ip netns add: %v", i, derr)
		}
		if files, below, _ := netnsDirState(t); files != 0 || below != 0 {
			t.Fatalf("round %d: %d files and %d mounts left below %s", i, files, below, netnsDir)
		}
	}
	t.Logf("concurrent: %d rounds, nothing left behind", rounds)
}

// freshNetnsDir puts a new tmpfs over /run holding a plain netns
// directory: as after a boot, it is not a mount point and its parent mount
// is private. The mounts it replaces are this process's private copies
// (the runtime made / MS_REC|MS_PRIVATE after CLONE_NEWNS), so nothing
// outside this mount namespace changes.
func freshNetnsDir(t *testing.T) {
	t.Helper()
	for _, mp := range mountPointsUnder(t, netnsDir) {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			t.Fatalf("detach private copy of %s: %v", mp, err)
		}
	}
	if err := unix.Mount("ipoib-test-run", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot mount a tmpfs over /run in a private mount namespace: %v", err)
		}
		t.Fatalf("tmpfs over /run: %v", err)
	}
	if err := os.Mkdir(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if n := len(mountPointsUnder(t, netnsDir)); n != 0 {
		t.Fatalf("%s: %d mounts on or below it, want a plain directory", netnsDir, n)
	}
}

func ipNetnsAdd(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
}

func ipNetnsDelete(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		t.Errorf("ip netns delete %s: %v: %s", name, err, out)
	}
}

// netnsDirState reports the files in the netns directory, the mounts
// strictly below it, and whether the topmost mount on it is shared.
func netnsDirState(t *testing.T) (files, below int, shared bool) {
	t.Helper()
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Logf("left in %s: %s", netnsDir, e.Name())
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 {
			continue
		}
		switch mp := fields[4]; {
		case mp == netnsDir:
			// mountinfo lists stacked mounts bottom first: the last wins.
			shared = slices.ContainsFunc(fields[6:], func(f string) bool { return strings.HasPrefix(f, "shared:") })
		case strings.HasPrefix(mp, netnsDir+"/"):
			below++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return len(entries), below, shared
}

// mountPointsUnder lists the mount points of this mount namespace at or
// below dir, deepest last as in mountinfo order, reversed so that the
// caller can unmount them in order.
func mountPointsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if mp := fields[4]; mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Reverse(mps)
	return mps
}
