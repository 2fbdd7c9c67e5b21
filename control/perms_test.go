//go:build unix

package control

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// With a permissive umask the control directory and socket must still be
// reachable by their owner only: "mode" reconfigures the interface.
func TestListenRestrictsDirAndSocket(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	t.Run("new dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run", "ipoib")
		s, err := Listen(dir, []Endpoint{newFake("h1")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		checkMode(t, dir, 0o700)
		checkMode(t, s.Path(), 0o600)
	})
	t.Run("existing open dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ipoib")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		checkMode(t, dir, 0o777)
		s, err := Listen(dir, []Endpoint{newFake("h1")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		checkMode(t, dir, 0o700)
		checkMode(t, s.Path(), 0o600)
		// Still serving its owner.
		c, err := Dial(s.Path(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		resp, err := c.Do(Request{Op: OpList})
		if err != nil || len(resp.Interfaces) != 1 {
			t.Fatalf("list through the restricted socket: %+v, %v", resp, err)
		}
	})
}

func checkMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Fatalf("%s: mode %#o, want %#o", path, got, want)
	}
}
