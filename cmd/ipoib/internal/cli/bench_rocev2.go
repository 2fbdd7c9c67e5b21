package cli

import (
	"context"
	"fmt"
	"os"

	"github.com/ipoibcm/ipoib/bench"
)

// minRoCEv2Ratio is the acceptance bar of issue 7: single-stream TCP over
// ib0 (RoCEv2, connected mode) at least this fraction of the udp-pipe.
const minRoCEv2Ratio = 0.8

// benchRoCEv2 is 'ipoib bench --iperf --hca rocev2': this binary's 'up'
// in two namespaces over a veth pair, against the udp-pipe baseline.
func benchRoCEv2(ctx context.Context, env *Env, cfg bench.RoCEv2SuiteConfig, asJSON bool, plotFile string) int {
	exe, err := os.Executable()
	if err != nil {
		return fail(env, "bench", fmt.Errorf("find own binary for 'ipoib up': %w", err))
	}
	cfg.Exe = exe
	rep, err := bench.RunRoCEv2IperfSuite(ctx, cfg)
	if err != nil {
		return fail(env, "bench", err)
	}
	if code := writeReport(env, rep, asJSON, plotFile); code != ExitOK {
		return code
	}
	for _, c := range rep.VsUDPPipe {
		if c.Mode == "connected" && c.Ratio < minRoCEv2Ratio {
			fmt.Fprintf(env.Stderr, "ipoib bench: connected mode reached %.3fx of the udp-pipe, below %.1fx\n", c.Ratio, minRoCEv2Ratio)
			return ExitFail
		}
	}
	return ExitOK
}
