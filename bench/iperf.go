package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrIperf is wrapped when iperf3 reports a failure in its JSON. iperf3
// -J exits 0 even when it could not connect, so the "error" key (or an
// empty "end") is the only reliable failure signal.
var ErrIperf = errors.New("iperf3 reported failure")

// IperfResult is what one iperf3 TCP client run measured.
type IperfResult struct {
	// Gbps is the receiver's goodput (end.sum_received), the figure to
	// report; SenderGbps is end.sum_sent.
	Gbps       float64 `json:"gbps"`
	SenderGbps float64 `json:"sender_gbps"`
	Bytes      int64   `json:"bytes"`
	// Seconds is the receiver's measured interval.
	Seconds     float64 `json:"seconds"`
	Retransmits int64   `json:"retransmits"`
	// CPU percentages from end.cpu_utilization_percent: the client's host
	// and the server's ("remote").
	CPUClient float64 `json:"cpu_client_percent"`
	CPUServer float64 `json:"cpu_server_percent"`
	// MSS is start.tcp_mss_default, a check that the MTU took effect.
	MSS        int    `json:"mss"`
	Congestion string `json:"congestion,omitempty"`
	Version    string `json:"version,omitempty"`
}

// Duration is Seconds as a time.Duration.
func (r IperfResult) Duration() time.Duration {
	return time.Duration(r.Seconds * float64(time.Second))
}

type iperfSum struct {
	Seconds       float64 `json:"seconds"`
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   int64   `json:"retransmits"`
}

type iperfJSON struct {
	Start struct {
		Version       string `json:"version"`
		TCPMSSDefault int    `json:"tcp_mss_default"`
	} `json:"start"`
	End   json.RawMessage `json:"end"`
	Error string          `json:"error"`
}

type iperfEnd struct {
	SumSent     *iperfSum `json:"sum_sent"`
	SumReceived *iperfSum `json:"sum_received"`
	CPU         struct {
		HostTotal   float64 `json:"host_total"`
		RemoteTotal float64 `json:"remote_total"`
	} `json:"cpu_utilization_percent"`
	SenderCongestion string `json:"sender_tcp_congestion"`
}

// ParseIperf3 decodes the JSON of an iperf3 -J TCP client run (iperf3
// 3.12 layout). A top-level "error" key, an empty or missing "end", or an
// "end" without the sent/received sums are failures wrapping ErrIperf.
func ParseIperf3(data []byte) (IperfResult, error) {
	var doc iperfJSON
	if err := json.Unmarshal(data, &doc); err != nil {
		return IperfResult{}, fmt.Errorf("iperf3 json: %w", err)
	}
	if doc.Error != "" {
		return IperfResult{}, fmt.Errorf("%w: %s", ErrIperf, doc.Error)
	}
	end := bytes.TrimSpace(doc.End)
	if len(end) == 0 || string(end) == "null" {
		return IperfResult{}, fmt.Errorf("%w: no \"end\" section", ErrIperf)
	}
	var e iperfEnd
	if err := json.Unmarshal(end, &e); err != nil {
		return IperfResult{}, fmt.Errorf("iperf3 json: end: %w", err)
	}
	if e.SumSent == nil || e.SumReceived == nil {
		return IperfResult{}, fmt.Errorf("%w: empty \"end\" (no sum_sent/sum_received; not a completed TCP test)", ErrIperf)
	}
	return IperfResult{
		Gbps:        e.SumReceived.BitsPerSecond / 1e9,
		SenderGbps:  e.SumSent.BitsPerSecond / 1e9,
		Bytes:       e.SumReceived.Bytes,
		Seconds:     e.SumReceived.Seconds,
		Retransmits: e.SumSent.Retransmits,
		CPUClient:   e.CPU.HostTotal,
		CPUServer:   e.CPU.RemoteTotal,
		MSS:         doc.Start.TCPMSSDefault,
		Congestion:  e.SenderCongestion,
		Version:     doc.Start.Version,
	}, nil
}
