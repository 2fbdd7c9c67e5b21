package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func sampleReport() *IperfReport {
	r := &IperfReport{Streams: 1, Runs: []IperfRun{
		{Scenario: ScenarioVeth, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 40, Retransmits: 0, CPUClient: 90, CPUServer: 80}},
		{Scenario: ScenarioTapPipe, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 8, Retransmits: 2, CPUClient: 50, CPUServer: 40}},
		{Scenario: ScenarioTapPipeOffload, Mode: "connected", MTU: 65520, Offloads: true, Result: &IperfResult{Gbps: 16}},
		{Scenario: ScenarioIB, Mode: "connected", MTU: 65520, Result: &IperfResult{Gbps: 2, Retransmits: 5, CPUClient: 30, CPUServer: 20}},
		{Scenario: ScenarioVeth, Mode: "datagram", MTU: 4092, Result: &IperfResult{Gbps: 20}},
		{Scenario: ScenarioTapPipe, Mode: "datagram", MTU: 4092, Err: "iperf3 reported failure: boom"},
		{Scenario: ScenarioIB, Mode: "datagram", MTU: 4092, Result: &IperfResult{Gbps: 1}},
	}}
	r.Compare()
	return r
}

func TestReportCompare(t *testing.T) {
	r := sampleReport()
	if len(r.Comparisons) != 2 {
		t.Fatalf("%d comparisons, want 2", len(r.Comparisons))
	}
	c := r.Comparisons[0]
	if c.Mode != "connected" || math.Abs(c.VsVeth-0.05) > 1e-12 || math.Abs(c.VsTapPipe-0.25) > 1e-12 ||
		c.TapPipeOffloadGbps != 16 || c.VsTapPipeOffload != 0.125 {
		t.Fatalf("connected comparison %+v", c)
	}
	d := r.Comparisons[1]
	if d.VsVeth != 0.05 || d.VsTapPipe != 0 || d.VsTapPipeOffload != 0 {
		t.Fatalf("datagram comparison %+v: failed baseline must give ratio 0", d)
	}
	if !r.Failed() {
		t.Fatal("report with a failed run not Failed")
	}
}

func TestReportTable(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "scenario mode mtu offloads Gbit/s retr cpu client % cpu server % vs veth vs tap-pipe vs tap-pipe-offload" {
		t.Fatalf("header %q", lines[0])
	}
	if got := strings.Join(strings.Fields(lines[3]), " "); got != "tap-pipe-offload connected 65520 yes 16.00 0 0.0 0.0 - - -" {
		t.Fatalf("offload tap-pipe row %q", got)
	}
	if got := strings.Join(strings.Fields(lines[4]), " "); got != "ib0 connected 65520 no 2.00 5 30.0 20.0 0.050x 0.250x 0.125x" {
		t.Fatalf("ib0 row %q", got)
	}
	if got := strings.Join(strings.Fields(lines[6]), " "); got != "tap-pipe datagram 4092 no FAILED - - - - - -" {
		t.Fatalf("failed row %q", got)
	}
	if !strings.Contains(b.String(), "errors:\n  tap-pipe/datagram: iperf3 reported failure: boom") {
		t.Fatalf("errors section missing:\n%s", b.String())
	}
}

func TestReportJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back IperfReport
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Runs) != 7 || back.Runs[3].Result.Gbps != 2 || back.Comparisons[0].VsTapPipe != 0.25 ||
		!back.Runs[2].Offloads || back.Comparisons[0].VsTapPipeOffload != 0.125 {
		t.Fatalf("json round trip lost data: %+v", back)
	}
}
