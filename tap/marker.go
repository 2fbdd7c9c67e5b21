package tap

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// markerMagic opens every owner marker; a file without it is not ours.
const markerMagic = "ipoib-netns-owner v1"

// ErrBadMarker is wrapped when an owner marker cannot be parsed.
var ErrBadMarker = errors.New("malformed netns owner marker")

// ownerMarker identifies the process that created a namespace. The start
// time (clock ticks since boot, /proc/<pid>/stat field 22) guards against
// pid reuse: a recycled pid has a different start time.
type ownerMarker struct {
	PID   int
	Start uint64
}

func (m ownerMarker) marshal() []byte {
	return fmt.Appendf(nil, "%s\npid %d\nstart %d\n", markerMagic, m.PID, m.Start)
}

// parseOwnerMarker decodes a marker file. It accepts exactly the layout
// marshal writes, so stray or truncated files are rejected.
func parseOwnerMarker(b []byte) (ownerMarker, error) {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) != 3 || string(lines[0]) != markerMagic {
		return ownerMarker{}, fmt.Errorf("%w: missing magic or wrong line count", ErrBadMarker)
	}
	pid, err := markerField(lines[1], "pid ")
	if err != nil {
		return ownerMarker{}, err
	}
	if pid == 0 || pid > 1<<22 {
		return ownerMarker{}, fmt.Errorf("%w: pid %d out of range", ErrBadMarker, pid)
	}
	start, err := markerField(lines[2], "start ")
	if err != nil {
		return ownerMarker{}, err
	}
	return ownerMarker{PID: int(pid), Start: start}, nil
}

func markerField(line []byte, key string) (uint64, error) {
	v, ok := bytes.CutPrefix(line, []byte(key))
	if !ok {
		return 0, fmt.Errorf("%w: expected %q", ErrBadMarker, key)
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrBadMarker, key, err)
	}
	return n, nil
}
