package main

import (
	"context"
	"io"

	"github.com/ipoibcm/ipoib/bench"
)

// runSoak is 'ipoib soak' (cli.Env.Soak): the soak parses its own flags,
// prints progress on stderr and the table or JSON on stdout, and returns 1
// on any violation.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return bench.SoakMain(ctx, args, stdout, stderr)
}
