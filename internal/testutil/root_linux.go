package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// NeedRoot skips the test unless it can create network namespaces and
// TAP devices: it runs as root and /dev/net/tun opens.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (uid 0) to create network namespaces and TAP devices")
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("/dev/net/tun not usable (%v): needs the tun module and a container with /dev/net/tun", err)
	}
	f.Close()
}

// SkipIfNetns skips the test if any of the named network namespaces
// exists: an ipoib fabric with those names runs on this machine, and the
// test would collide with it.
func SkipIfNetns(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err == nil {
			t.Skipf("namespace %s exists: an ipoib fabric is running on this machine", n)
		}
	}
}
