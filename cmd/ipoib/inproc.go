package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/ipoibcm/ipoib/bench"
	"github.com/ipoibcm/ipoib/cmd/ipoib/internal/cli"
)

// runInProc is 'ipoib bench' without --iperf: TCP between two in-process
// netstack hosts. TODO(engine): measure over ib0 too once the engine
// provides its bench.LinkFactory; the direct link is the baseline.
func runInProc(ctx context.Context, o cli.InProcOptions, out io.Writer) error {
	res, err := bench.InProcTCP(ctx, o.Bytes, o.MTU, bench.DirectLink)
	if err != nil {
		return fmt.Errorf("in-process tcp: %w", err)
	}
	if o.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"link": "direct", "mtu": o.MTU, "result": res})
	}
	_, err = fmt.Fprintf(out, "direct link, mtu %d: %s\n", o.MTU, res)
	return err
}
