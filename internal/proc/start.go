// Package proc identifies a running process by its pid and its start time
// (field 22 of /proc/<pid>/stat). PIDs are reused, so a pid alone does not
// say that the process which left a file behind is still the one running:
// tap's namespace owner markers and control's sockets both record the
// pair and treat a mismatch as a dead owner.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// StartTime is the start time of process pid in clock ticks since boot.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return ParseStartTime(b)
}

// Alive reports whether process pid runs and started at start.
func Alive(pid int, start uint64) bool {
	got, err := StartTime(pid)
	return err == nil && got == start
}

// ParseStartTime extracts the start time (field 22) from the contents of
// /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from the last ')'.
func ParseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	// After ") " come fields 3, 4, ...; field 22 is the 20th of them.
	fields := bytes.Fields(stat[i+1:])
	const startIndex = 22 - 3
	if len(fields) <= startIndex {
		return 0, fmt.Errorf("proc stat: %d fields after command, need %d", len(fields), startIndex+1)
	}
	n, err := strconv.ParseUint(string(fields[startIndex]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat: start time: %w", err)
	}
	return n, nil
}
