package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestBinaryBenchRoCEv2UpProfiles: 'bench --iperf --hca rocev2
// --cpuprofile F' writes F for itself and F.MODE.a, F.MODE.b for the two
// 'ipoib up' processes, where the engine and the HCA run: each a CPU
// profile (gzipped protobuf) whose samples name the RoCEv2 device's code.
func TestBinaryBenchRoCEv2UpProfiles(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not in PATH: apt-get install iperf3")
	}
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	r := runIpoib(t, "bench", "--iperf", "--hca", "rocev2", "--modes", "datagram", "--duration", "1s", "--cpuprofile", prof)
	if r.code != 0 {
		t.Fatalf("bench: exit %d\n%s", r.code, short(r.stderr))
	}
	for _, f := range []string{prof, prof + ".datagram.a", prof + ".datagram.b"} {
		p := readProfile(t, f)
		if f != prof && !bytes.Contains(p, []byte("ipoib/hca/rocev2.")) {
			t.Errorf("%s: %d bytes, no sample in the RoCEv2 device: not an 'ipoib up' profile", f, len(p))
		}
	}
	if _, err := os.Stat(prof + ".connected.a"); !os.IsNotExist(err) {
		t.Errorf("profile of a mode not run: %v", err)
	}
}

// readProfile returns the decompressed protobuf of a pprof file.
func readProfile(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: not a pprof profile: %v", path, err)
	}
	b, err := io.ReadAll(z)
	if err != nil || len(b) == 0 {
		t.Fatalf("%s: %d bytes, %v", path, len(b), err)
	}
	return b
}
