package soak

import (
	"os"
	"strings"
)

// openSockets counts the process's open sockets, or -1 if it cannot: a
// backend's sockets must all be closed once it is.
func openSockets() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
