package tap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// requireRoot skips unless the test can create namespaces and TAPs.
func requireRoot(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t)
}

var nameSeq atomic.Int32

// uniqueName gives each test its own namespace name so parallel runs of
// the package never collide with each other or with a running lab.
func uniqueName(tag string) string {
	return fmt.Sprintf("ipoibt-%d-%d-%s", os.Getpid(), nameSeq.Add(1), tag)
}

// testOwner returns an Owner with a private marker directory.
func testOwner(t *testing.T) *Owner {
	return &Owner{MarkerDir: t.TempDir()}
}

// createNetns creates a namespace and registers its deletion, checking
// that nothing is left behind.
func createNetns(t *testing.T, o *Owner, tag string) *Netns {
	t.Helper()
	n, err := o.Create(uniqueName(tag))
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		name := n.Name()
		if _, err := os.Stat(filepath.Join(netnsDir, name)); errors.Is(err, fs.ErrNotExist) {
			return // the test deleted it itself
		}
		if err := n.Delete(); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
		assertNetnsGone(t, o, name)
	})
	return n
}

func assertNetnsGone(t *testing.T, o *Owner, name string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(netnsDir, name)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("netns %s still mounted (stat err %v)", name, err)
	}
	if _, err := os.Stat(o.markerPath(name)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("marker for %s still present (stat err %v)", name, err)
	}
}
