package tap

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// prepareNetnsDir makes dir a shared mount point before a named namespace
// is bind-mounted into it, as iproute2's netns_add does. On a freshly
// booted machine /run/netns is a plain directory of a private parent
// mount; a namespace file mounted there is duplicated by the first
// `ip netns add` afterwards, which bind-mounts the directory onto itself
// recursively, and the copy hidden below that bind keeps the file busy, so
// Delete's unlink fails with EBUSY. Once dir is a shared mount of its own,
// every namespace file mounted in it is shared too, a later bind of dir is
// a peer, and unmounting any copy unmounts them all.
//
// Against a concurrent `ip netns add` (or another of our processes) doing
// the same: if both see EINVAL and both bind, the binds stack; whichever
// finishes first has made its bind shared before any namespace file is
// mounted in it, so the later bind copies nothing or joins its peer
// group, and make-shared always acts on the topmost bind, where new
// namespace files go. The worst left behind is an empty bind hidden under
// the other, which iproute2 leaves in the same race.
func prepareNetnsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("prepare %s: %w", dir, err)
	}
	bound := false
	for {
		err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: dir is not a mount point yet. Anything else, or EINVAL
		// again after our own bind, is not ours to fix.
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("prepare %s: make shared: %w", dir, err)
		}
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("prepare %s: bind onto itself: %w", dir, err)
		}
		bound = true
	}
}
