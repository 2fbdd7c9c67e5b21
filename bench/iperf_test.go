package bench

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseIperf3Success(t *testing.T) {
	r, err := ParseIperf3(readTestdata(t, "iperf3-tcp-ok.json"))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	// Values recorded from iperf 3.12 over loopback (testdata).
	if math.Abs(r.Gbps-9.47896819756898) > 1e-9 || math.Abs(r.SenderGbps-9.53010726369592) > 1e-9 {
		t.Errorf("gbps %v sender %v", r.Gbps, r.SenderGbps)
	}
	if r.Bytes != 1185153024 || r.Retransmits != 4 || r.MSS != 32768 {
		t.Errorf("bytes %d retr %d mss %d", r.Bytes, r.Retransmits, r.MSS)
	}
	if math.Abs(r.CPUClient-7.569505654570715) > 1e-9 || math.Abs(r.CPUServer-46.73441639590102) > 1e-9 {
		t.Errorf("cpu %v %v", r.CPUClient, r.CPUServer)
	}
	if r.Version != "iperf 3.12" || r.Duration().Seconds() < 1 {
		t.Errorf("version %q duration %v", r.Version, r.Duration())
	}
}

func TestParseIperf3Failures(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{"iperf3-refused.json", "Connection refused"},
		{"iperf3-error-with-end.json", "the server has terminated"},
		{"iperf3-empty-end.json", "empty \"end\""},
	} {
		_, err := ParseIperf3(readTestdata(t, tc.file))
		if !errors.Is(err, ErrIperf) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want ErrIperf mentioning %q", tc.file, err, tc.want)
		}
	}
	if _, err := ParseIperf3([]byte(`{"start":{}}`)); !errors.Is(err, ErrIperf) {
		t.Errorf("missing end: %v", err)
	}
	if _, err := ParseIperf3([]byte(`not json`)); err == nil || errors.Is(err, ErrIperf) {
		t.Errorf("garbage: %v, want a JSON error", err)
	}
}

func FuzzParseIperf3(f *testing.F) {
	for _, name := range []string{"iperf3-tcp-ok.json", "iperf3-refused.json", "iperf3-empty-end.json"} {
		f.Add(readTestdata(f, name))
	}
	f.Add([]byte(`{"end":{"sum_sent":{},"sum_received":null}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseIperf3(b)
		if err == nil && (math.IsNaN(r.Gbps) || math.IsInf(r.Gbps, 0)) {
			t.Fatalf("accepted a non-finite rate: %+v", r)
		}
	})
}
