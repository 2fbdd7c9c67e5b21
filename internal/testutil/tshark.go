package testutil

import (
	"os/exec"
	"strings"
	"testing"
)

// TsharkFields runs tshark over a capture with the options opts (at
// least "-r FILE"), keeps the packets that match the display filter (all
// if ""), and returns one row per packet with the named fields in order.
func TsharkFields(t testing.TB, tshark string, opts []string, filter string, fields ...string) [][]string {
	t.Helper()
	args := append(append([]string(nil), opts...), "-T", "fields", "-E", "separator=|")
	if filter != "" {
		args = append(args, "-Y", filter)
	}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark %v: %v", args, err)
	}
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			rows = append(rows, strings.Split(l, "|"))
		}
	}
	return rows
}
