package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/ipoibcm/ipoib/bench"
)

// runInProc is 'ipoib bench' without --iperf: TCP between two in-process
// netstack hosts joined directly and by ib0 in both modes, the median of
// o.Runs runs per row, as a table with the ratios or as JSON.
func runInProc(ctx context.Context, o inProcOptions, out io.Writer) error {
	rep, err := bench.RunInProcSuite(ctx, bench.InProcSuiteConfig{
		Bytes:        o.Bytes,
		Runs:         o.Runs,
		ConnectedMTU: o.MTU,
		DatagramMTU:  o.DatagramMTU,
		Seed:         1,
		Progress:     o.Progress,
	})
	if err != nil {
		return fmt.Errorf("in-process bench: %w", err)
	}
	if o.JSON {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteTable(out)
	}
	if err == nil && o.Plot != "" {
		err = writePlotFile(o.Plot, rep.Chart().WriteSVG)
	}
	if err != nil {
		return fmt.Errorf("in-process bench: report: %w", err)
	}
	return nil
}
