package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Scenario names of the iperf3 suite.
const (
	ScenarioVeth    = "veth"     // the kernel's own path between namespaces
	ScenarioTapPipe = "tap-pipe" // two TAPs joined by an in-process copy loop
	ScenarioIB      = "ib0"      // ib0 over the soft fabric through the IPoIB engine
	// ScenarioTapPipeOffload is the tap-pipe with vnet-header TAPs whose
	// frames cross with their virtio headers, super frames whole: the
	// upper bound of a userspace TAP bridge.
	ScenarioTapPipeOffload = "tap-pipe-offload"
)

// scenarioOffloads reports whether a scenario's link moves super frames
// and partial checksums between the hosts (veth does, as the kernel's own
// path; the naive tap-pipe and the udp-pipe do not). An ib0 row's comes
// from how its link was built (IperfSuiteConfig.IBOffloads).
func scenarioOffloads(s string) bool {
	return s == ScenarioVeth || s == ScenarioTapPipeOffload
}

// IperfRun is one iperf3 measurement of the suite.
type IperfRun struct {
	Scenario string `json:"scenario"`
	Mode     string `json:"mode"` // the ib0 mode whose MTU this run uses
	MTU      int    `json:"mtu"`
	// Offloads: the link passed super frames and partial checksums
	// between the hosts (scenarioOffloads).
	Offloads bool         `json:"offloads"`
	Result   *IperfResult `json:"result,omitempty"`
	Err      string       `json:"error,omitempty"`
}

// IperfComparison sets an ib0 run against the baselines at the same MTU.
// A ratio is 0 when either side failed.
type IperfComparison struct {
	Mode        string  `json:"mode"`
	MTU         int     `json:"mtu"`
	IBGbps      float64 `json:"ib0_gbps"`
	VethGbps    float64 `json:"veth_gbps"`
	TapPipeGbps float64 `json:"tap_pipe_gbps"`
	VsVeth      float64 `json:"ratio_to_veth"`
	VsTapPipe   float64 `json:"ratio_to_tap_pipe"`
	// TapPipeOffloadGbps and VsTapPipeOffload set ib0 against the offload
	// tap-pipe, the upper bound of a userspace TAP bridge.
	TapPipeOffloadGbps float64 `json:"tap_pipe_offload_gbps"`
	VsTapPipeOffload   float64 `json:"ratio_to_tap_pipe_offload"`
}

// IperfReport is the outcome of RunIperfSuite.
type IperfReport struct {
	Started     time.Time         `json:"started"`
	Duration    time.Duration     `json:"test_duration_ns"`
	Streams     int               `json:"streams"`
	Runs        []IperfRun        `json:"runs"`
	Comparisons []IperfComparison `json:"comparisons"`
}

// Compare recomputes Comparisons from Runs: one per ib0 run.
func (r *IperfReport) Compare() {
	r.Comparisons = r.Comparisons[:0]
	gbps := func(scenario, mode string) float64 {
		for _, run := range r.Runs {
			if run.Scenario == scenario && run.Mode == mode && run.Result != nil {
				return run.Result.Gbps
			}
		}
		return 0
	}
	ratio := func(a, b float64) float64 {
		if a == 0 || b == 0 {
			return 0
		}
		return a / b
	}
	for _, run := range r.Runs {
		if run.Scenario != ScenarioIB {
			continue
		}
		c := IperfComparison{Mode: run.Mode, MTU: run.MTU,
			IBGbps: gbps(ScenarioIB, run.Mode), VethGbps: gbps(ScenarioVeth, run.Mode), TapPipeGbps: gbps(ScenarioTapPipe, run.Mode)}
		c.VsVeth, c.VsTapPipe = ratio(c.IBGbps, c.VethGbps), ratio(c.IBGbps, c.TapPipeGbps)
		c.TapPipeOffloadGbps = gbps(ScenarioTapPipeOffload, run.Mode)
		c.VsTapPipeOffload = ratio(c.IBGbps, c.TapPipeOffloadGbps)
		r.Comparisons = append(r.Comparisons, c)
	}
}

// Failed reports whether any run failed.
func (r *IperfReport) Failed() bool {
	for _, run := range r.Runs {
		if run.Err != "" {
			return true
		}
	}
	return false
}

// WriteTable prints the runs as an aligned table, ib0 rows carrying their
// ratios to both baselines, then any errors.
func (r *IperfReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "scenario\tmode\tmtu\toffloads\tGbit/s\tretr\tcpu client %%\tcpu server %%\tvs veth\tvs tap-pipe\tvs tap-pipe-offload\t\n")
	cmp := map[string]IperfComparison{}
	for _, c := range r.Comparisons {
		cmp[c.Mode] = c
	}
	for _, run := range r.Runs {
		if run.Result == nil {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\tFAILED\t-\t-\t-\t-\t-\t-\t\n", run.Scenario, run.Mode, run.MTU, yesNo(run.Offloads))
			continue
		}
		res := run.Result
		vsVeth, vsPipe, vsOffload := "-", "-", "-"
		if c, ok := cmp[run.Mode]; ok && run.Scenario == ScenarioIB {
			vsVeth, vsPipe, vsOffload = fmtRatio(c.VsVeth), fmtRatio(c.VsTapPipe), fmtRatio(c.VsTapPipeOffload)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.2f\t%d\t%.1f\t%.1f\t%s\t%s\t%s\t\n", run.Scenario, run.Mode, run.MTU, yesNo(run.Offloads),
			res.Gbps, res.Retransmits, res.CPUClient, res.CPUServer, vsVeth, vsPipe, vsOffload)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var errs []string
	for _, run := range r.Runs {
		if run.Err != "" {
			errs = append(errs, fmt.Sprintf("%s/%s: %s", run.Scenario, run.Mode, run.Err))
		}
	}
	if len(errs) > 0 {
		_, err := fmt.Fprintf(w, "errors:\n  %s\n", strings.Join(errs, "\n  "))
		return err
	}
	return nil
}

func fmtRatio(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fx", x)
}

// WriteJSON writes the report as indented JSON.
func (r *IperfReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
