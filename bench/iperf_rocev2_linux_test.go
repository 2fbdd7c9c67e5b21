package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestRoCEv2ReportComparesWithUDPPipe(t *testing.T) {
	r := &RoCEv2Report{IperfReport: IperfReport{Runs: []IperfRun{
		{Scenario: ScenarioUDPPipe, Mode: "connected", MTU: 65493, Result: &IperfResult{Gbps: 4}},
		{Scenario: ScenarioUDPPipeOffload, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 6.8}},
		{Scenario: ScenarioIBRoCEv2, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 3.4}},
		{Scenario: ScenarioUDPPipe, Mode: "datagram", MTU: 4092, Result: &IperfResult{Gbps: 1}},
		{Scenario: ScenarioIBRoCEv2, Mode: "datagram", MTU: 4092, Err: "ipoib up exited"},
	}}}
	r.compare()
	if len(r.VsUDPPipe) != 2 {
		t.Fatalf("%+v", r.VsUDPPipe)
	}
	if c := r.VsUDPPipe[0]; c.Mode != "connected" || c.Ratio < 0.849 || c.Ratio > 0.851 || c.RatioOffload < 0.499 || c.RatioOffload > 0.501 {
		t.Fatalf("connected: %+v", c)
	}
	if c := r.VsUDPPipe[1]; c.Ratio != 0 || c.RatioOffload != 0 || c.UDPPipeGbps != 1 {
		t.Fatalf("failed ib0 run must give ratio 0: %+v", c)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "connected mode: ib0-rocev2 3.40 Gbit/s vs udp-pipe 4.00 Gbit/s: 0.850x, vs udp-pipe-offload 6.80 Gbit/s: 0.500x") {
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
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Runs) != 5 || back.VsUDPPipe[0].Ratio != r.VsUDPPipe[0].Ratio {
		t.Fatalf("json round trip: %v %+v", err, back)
	}
}
