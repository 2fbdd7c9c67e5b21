package cli

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/internal/proc"
)

// waitPid waits on a pidfd for process pid to exit: it becomes readable
// when the process is gone, so the wait ends with the exit, not on a
// polling tick. The start time, checked once the pidfd is open, tells
// the process from a later one that reused its pid.
func waitPid(pid int, start uint64, timeout time.Duration) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !proc.Alive(pid, start) {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("pid %d still running %v after the stop request", pid, timeout)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
	}
}
