package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

func TestRoCEv2ReportComparesWithUDPPipe(t *testing.T) {
	r := &RoCEv2Report{IperfReport: IperfReport{Runs: []IperfRun{
		{Scenario: ScenarioUDPPipe, Mode: "connected", MTU: 65493, Result: &IperfResult{Gbps: 4}},
		{Scenario: ScenarioUDPPipeOffload, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 6.8}},
		{Scenario: ScenarioWireGuardGo, Mode: "connected", MTU: 8920, Result: &IperfResult{Gbps: 1.7}},
		{Scenario: ScenarioIBRoCEv2, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 3.4}},
		{Scenario: ScenarioUDPPipe, Mode: "datagram", MTU: 4092, Result: &IperfResult{Gbps: 1}},
		{Scenario: ScenarioWireGuardGo, Mode: "datagram", MTU: 8920, Result: &IperfResult{Gbps: 2}},
		{Scenario: ScenarioIBRoCEv2, Mode: "datagram", MTU: 4092, Err: "ipoib up exited"},
	}}}
	r.compare()
	if len(r.VsUDPPipe) != 2 {
		t.Fatalf("%+v", r.VsUDPPipe)
	}
	if c := r.VsUDPPipe[0]; c.Mode != "connected" || c.Ratio < 0.849 || c.Ratio > 0.851 || c.RatioOffload < 0.499 || c.RatioOffload > 0.501 ||
		c.WireGuardGoGbps != 1.7 || c.RatioWireGuardGo != 2 {
		t.Fatalf("connected: %+v", c)
	}
	if c := r.VsUDPPipe[1]; c.Ratio != 0 || c.RatioOffload != 0 || c.RatioWireGuardGo != 0 || c.UDPPipeGbps != 1 || c.WireGuardGoGbps != 2 {
		t.Fatalf("failed ib0 run must give ratio 0: %+v", c)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "connected mode: ib0-rocev2 3.40 Gbit/s vs udp-pipe 4.00 Gbit/s: 0.850x, vs udp-pipe-offload 6.80 Gbit/s: 0.500x, vs wireguard-go 1.70 Gbit/s: 2.000x") {
		t.Fatalf("table:\n%s", table.String())
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Runs      []IperfRun         `json:"runs"`
		VsUDPPipe []RoCEv2Comparison `json:"vs_udp_pipe"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Runs) != 7 || back.VsUDPPipe[0] != r.VsUDPPipe[0] {
		t.Fatalf("json round trip: %v %+v", err, back)
	}
	for _, key := range []string{`"wireguard_go_gbps": 1.7`, "\"ratio_to_wireguard_go\": 2\n"} {
		if !strings.Contains(js.String(), key) {
			t.Errorf("json lacks %s:\n%s", key, js.String())
		}
	}
	var svg bytes.Buffer
	if err := r.Chart().WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(testutil.SVGTexts(t, svg.Bytes()), "\n")
	for _, want := range []string{"wireguard-go", "0.50 x udp-pipe-offload, 2.00 x wireguard-go"} {
		if !strings.Contains(joined, want) {
			t.Errorf("SVG lacks %q; texts:\n%s", want, joined)
		}
	}
}

// TestRoCEv2SuiteRunsWireGuardGo: every mode runs wireguard-go, after the
// udp-pipes and before ib0, at the veth's MTU less WireGuardOverhead
// whatever the mode's MTU; the other scenarios keep theirs.
func TestRoCEv2SuiteRunsWireGuardGo(t *testing.T) {
	cfg := RoCEv2SuiteConfig{}
	cfg.defaults()
	var names []string
	for _, s := range cfg.steps() {
		names = append(names, s.scenario)
	}
	if got, want := strings.Join(names, " "), "udp-pipe udp-pipe-offload wireguard-go ib0-rocev2"; got != want {
		t.Fatalf("steps %q, want %q", got, want)
	}
	for _, mtu := range []int{65520, 4092} {
		if got := cfg.runMTU(ScenarioWireGuardGo, mtu); got != 8920 {
			t.Errorf("wireguard-go at mode MTU %d runs at %d, want 8920", mtu, got)
		}
		if got := cfg.runMTU(ScenarioIBRoCEv2, mtu); got != mtu {
			t.Errorf("ib0 at mode MTU %d runs at %d", mtu, got)
		}
	}
	if got := cfg.runMTU(ScenarioUDPPipe, 65520); got != MaxUDPPipeFrame-14 {
		t.Errorf("udp-pipe at 65520 runs at %d", got)
	}
}
