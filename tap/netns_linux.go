package tap

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/ipoibcm/ipoib/internal/proc"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const (
	// DefaultMarkerDir holds one owner marker per namespace this project
	// created, named like the namespace.
	DefaultMarkerDir = "/run/ipoib/netns-owner"
	// netnsDir is where ip-netns (and netns.NewNamed) bind-mount named
	// namespaces; Create makes it a shared mount point first
	// (prepareNetnsDir).
	netnsDir = "/run/netns"
)

// ErrNotOwner is returned when asked to delete a namespace whose marker
// names another live process, or that has no marker at all.
var ErrNotOwner = errors.New("namespace not owned by this process")

// Owner creates, recognises and removes the named namespaces of one
// process. It holds no state besides its configuration, so several Owners
// with different marker directories can coexist (tests use a temporary
// one).
type Owner struct {
	// MarkerDir is where owner markers live; empty means DefaultMarkerDir.
	MarkerDir string
	// Logger receives one line per namespace created or cleaned; nil
	// discards.
	Logger *slog.Logger
}

func (o *Owner) markerDir() string {
	if o.MarkerDir == "" {
		return DefaultMarkerDir
	}
	return o.MarkerDir
}

func (o *Owner) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

func (o *Owner) markerPath(name string) string { return filepath.Join(o.markerDir(), name) }

// Netns is an open handle on a named network namespace.
type Netns struct {
	name   string
	handle netns.NsHandle
	owner  *Owner
}

// Name is the namespace's name under /run/netns.
func (n *Netns) Name() string { return n.name }

// Handle is the open namespace file descriptor, for netlink.NewHandleAt
// and netlink.NsFd.
func (n *Netns) Handle() netns.NsHandle { return n.handle }

// validNetnsName rejects names that would escape /run/netns or the marker
// directory.
func validNetnsName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 64 {
		return fmt.Errorf("namespace name %q: %w", name, fs.ErrInvalid)
	}
	return nil
}

// Create makes the named namespace, marks it as this process's, and brings
// its loopback up. The marker is written before the namespace exists, so a
// crash in between leaves at worst a marker without a namespace, which
// CleanupStale removes.
func (o *Owner) Create(name string) (*Netns, error) {
	if err := validNetnsName(name); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(netnsDir, name)); err == nil {
		return nil, o.exists(name)
	}
	me, err := selfMarker()
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	if err := os.MkdirAll(o.markerDir(), 0o755); err != nil {
		return nil, fmt.Errorf("create netns %s: marker dir: %w", name, err)
	}
	if err := os.WriteFile(o.markerPath(name), me.marshal(), 0o644); err != nil {
		return nil, fmt.Errorf("create netns %s: marker: %w", name, err)
	}
	if err := prepareNetnsDir(netnsDir); err != nil {
		os.Remove(o.markerPath(name))
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	var h netns.NsHandle
	err = onLockedThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("current netns: %w", err)
		}
		defer orig.Close()
		h, err = netns.NewNamed(name)
		if err != nil {
			// NewNamed may have unshared already; go back before failing.
			if serr := netns.Set(orig); serr != nil {
				return errThreadTainted{fmt.Errorf("newnamed: %w; restore: %w", err, serr)}
			}
			return fmt.Errorf("newnamed: %w", err)
		}
		if err := netns.Set(orig); err != nil {
			return errThreadTainted{fmt.Errorf("restore netns: %w", err)}
		}
		return nil
	})
	if err != nil {
		os.Remove(o.markerPath(name))
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	n := &Netns{name: name, handle: h, owner: o}
	if err := n.linkUp("lo"); err != nil {
		n.Delete()
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	o.logger().Info("netns created", "name", name)
	return n, nil
}

// NetnsExistsError is Create's error for a name that is taken, saying
// whose the namespace is, as far as the owner markers tell: a running
// ipoib process (OwnerPID, Running), one that is gone (OwnerPID, not
// Running: CleanupStale removes it), or nobody known (OwnerPID 0: not
// made by ipoib, or marked in another marker directory).
type NetnsExistsError struct {
	Name     string
	OwnerPID int
	Running  bool
}

func (e *NetnsExistsError) Error() string {
	whose := "no ipoib owner marker: not made by ipoib"
	switch {
	case e.OwnerPID != 0 && e.Running:
		whose = fmt.Sprintf("made by ipoib process %d, which is running", e.OwnerPID)
	case e.OwnerPID != 0:
		whose = fmt.Sprintf("made by ipoib process %d, which is gone", e.OwnerPID)
	}
	return fmt.Sprintf("create netns %s: %v (%s)", e.Name, fs.ErrExist, whose)
}

// Unwrap makes it an fs.ErrExist.
func (e *NetnsExistsError) Unwrap() error { return fs.ErrExist }

// exists is the NetnsExistsError for name, from its marker.
func (o *Owner) exists(name string) error {
	e := &NetnsExistsError{Name: name}
	if m, err := readMarker(o.markerPath(name)); err == nil {
		e.OwnerPID, e.Running = m.PID, processAlive(m)
	}
	return e
}

// Open returns a handle on an existing named namespace without claiming
// it; Delete on such a handle fails unless this process's marker is there.
func (o *Owner) Open(name string) (*Netns, error) {
	if err := validNetnsName(name); err != nil {
		return nil, err
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", name, err)
	}
	return &Netns{name: name, handle: h, owner: o}, nil
}

func (n *Netns) linkUp(name string) error {
	nh, err := n.Netlink()
	if err != nil {
		return err
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netns %s: link %s: %w", n.name, name, err)
	}
	if err := nh.LinkSetUp(l); err != nil {
		return fmt.Errorf("netns %s: link %s up: %w", n.name, name, err)
	}
	return nil
}

// Netlink opens a netlink handle bound to the namespace; the caller closes
// it.
func (n *Netns) Netlink() (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(n.handle)
	if err != nil {
		return nil, fmt.Errorf("netns %s: netlink handle: %w", n.name, err)
	}
	return h, nil
}

// Do runs fn on an OS thread that is inside the namespace, then returns
// the thread to the original namespace. If that fails, the thread is never
// unlocked, so the runtime retires it instead of reusing it elsewhere.
func (n *Netns) Do(fn func() error) error {
	return onLockedThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("current netns: %w", err)
		}
		defer orig.Close()
		if err := netns.Set(n.handle); err != nil {
			return fmt.Errorf("enter netns %s: %w", n.name, err)
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			return errThreadTainted{fmt.Errorf("leave netns %s: %w", n.name, err)}
		}
		return ferr
	})
}

// Close releases the namespace handle without deleting the namespace.
func (n *Netns) Close() error {
	if n.handle == -1 {
		return nil
	}
	err := n.handle.Close()
	n.handle = -1
	if err != nil {
		return fmt.Errorf("netns %s: close: %w", n.name, err)
	}
	return nil
}

// Delete removes the namespace and its marker, provided the marker says
// this process created it. Links inside go with the namespace once the
// last reference (our handle, a TAP fd, a process) is gone.
func (n *Netns) Delete() error {
	m, err := readMarker(n.owner.markerPath(n.name))
	if err != nil {
		return fmt.Errorf("delete netns %s: %w: %w", n.name, ErrNotOwner, err)
	}
	if m.PID != os.Getpid() {
		return fmt.Errorf("delete netns %s: marker pid %d: %w", n.name, m.PID, ErrNotOwner)
	}
	cerr := n.Close()
	if err := deleteNamed(n.name); err != nil {
		return fmt.Errorf("delete netns %s: %w", n.name, err)
	}
	if err := os.Remove(n.owner.markerPath(n.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete netns %s: marker: %w", n.name, err)
	}
	n.owner.logger().Info("netns deleted", "name", n.name)
	return cerr
}

func deleteNamed(name string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, name)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil {
		return fmt.Errorf("unmount: %w", err)
	}
	return nil
}

// CleanupStale removes every marked namespace whose owner process is dead,
// and its marker. Namespaces without a marker are never touched. It
// returns the names removed.
func (o *Owner) CleanupStale() ([]string, error) {
	entries, err := os.ReadDir(o.markerDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cleanup stale netns: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || validNetnsName(name) != nil {
			continue
		}
		m, err := readMarker(o.markerPath(name))
		if err != nil {
			// Not a marker we wrote: leave it and its namespace alone.
			o.logger().Warn("ignoring unreadable netns marker", "name", name, "err", err)
			continue
		}
		if processAlive(m) {
			continue
		}
		if err := deleteNamed(name); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: %w", name, err))
			continue
		}
		if err := os.Remove(o.markerPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("netns %s marker: %w", name, err))
			continue
		}
		o.logger().Info("removed stale netns", "name", name, "owner_pid", m.PID)
		removed = append(removed, name)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("cleanup stale netns: %w", err)
	}
	return removed, nil
}

func readMarker(path string) (ownerMarker, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ownerMarker{}, fmt.Errorf("read marker: %w", err)
	}
	return parseOwnerMarker(b)
}

func selfMarker() (ownerMarker, error) {
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		return ownerMarker{}, err
	}
	return ownerMarker{PID: os.Getpid(), Start: start}, nil
}

// processAlive reports whether the marker's process still runs: the pid
// exists and started at the recorded time.
func processAlive(m ownerMarker) bool { return proc.Alive(m.PID, m.Start) }

// errThreadTainted marks a failure after which the locked thread may be in
// the wrong namespace and must not return to the scheduler's pool.
type errThreadTainted struct{ err error }

func (e errThreadTainted) Error() string { return e.err.Error() }
func (e errThreadTainted) Unwrap() error { return e.err }

// onLockedThread runs fn on a fresh goroutine locked to its OS thread, so
// namespace switches never leak into other goroutines. The thread is
// unlocked only if fn left it clean.
func onLockedThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := fn()
		var tainted errThreadTainted
		if !errors.As(err, &tainted) {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}
