package cli

import (
	"context"
	"fmt"
	"os"

	"github.com/ipoibcm/ipoib/bench"
)

// benchRoCEv2 is 'ipoib bench --iperf --hca rocev2': this binary's 'up'
// in two namespaces over a veth pair, against the udp-pipe, udp-pipe-offload
// and wireguard-go baselines over the same veth.
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
	return writeReport(env, rep, asJSON, plotFile)
}
