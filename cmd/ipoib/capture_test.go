package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// TestBinaryCaptureInterrupted: 'ipoib capture' stopped by SIGINT or
// SIGTERM in the middle of an iperf3 stream leaves a file tshark reads
// whole (no "cut short in the middle of a packet"), every ICRC valid,
// and exits 0 with its summary line.
func TestBinaryCaptureInterrupted(t *testing.T) {
	needRoot(t)
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not in PATH: apt-get install tshark")
	}
	iperf3, err := exec.LookPath("iperf3")
	if err != nil {
		t.Skip("iperf3 not in PATH: apt-get install iperf3")
	}
	nsPrefix := fmt.Sprintf("ipoib-c%d-", os.Getpid())
	h1, h2, dst := nsPrefix+"1", nsPrefix+"2", "10.77.91.2"
	ctl := t.TempDir()
	checkGone(t, nsPrefix, ctl)
	fab := startDaemon(t, "stop with Ctrl-C", "fabric", "--hosts", "2", "--netns-prefix", nsPrefix, "--prefix", "10.77.91.0/24", "--control-dir", ctl)
	t.Cleanup(func() {
		fab.stop()
		checkGone(t, nsPrefix, ctl)
	})
	for k, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			// A server of its own per signal: the previous client was
			// killed mid-test, and a shared server still busy with that
			// test would refuse this one, leaving nothing to capture.
			port := strconv.Itoa(5201 + k)
			srv := startIperf3Server(t, h2, dst, "-p", port)
			defer func() { srv.Process.Kill(); srv.Wait() }()
			client := exec.Command("ip", "netns", "exec", h1, iperf3, "-c", dst, "-p", port, "-t", "60")
			if err := client.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { client.Process.Kill(); client.Wait() }()

			file := filepath.Join(t.TempDir(), "capture.pcapng")
			cmd := ipoibCmd(context.Background(), t, "capture", "--host", h1, "-w", file, "--control-dir", ctl)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// Interrupt it mid-stream: once the file has several of the
			// server's 256 KiB writes, with the stream still running.
			const mid = 4 << 20
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			deadline := time.After(60 * time.Second)
			for size := int64(0); size < mid; {
				select {
				case err := <-exited:
					t.Fatalf("capture exited before it was interrupted: %v: %s", err, stderr.String())
				case <-deadline:
					t.Fatalf("capture file at %d bytes after 60 s of iperf3", size)
				case <-tick.C:
					if fi, err := os.Stat(file); err == nil {
						size = fi.Size()
					}
				}
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil || !strings.Contains(stderr.String(), "bytes of pcapng") {
					t.Fatalf("capture after %v: %v, stderr %q; want exit 0 and the summary", sig, err, stderr.String())
				}
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("capture did not exit within 30 s of %v", sig)
			}

			var tout, terr bytes.Buffer
			read := exec.Command(tshark, "-r", file, "-T", "fields", "-e", "frame.number")
			read.Stdout, read.Stderr = &tout, &terr
			rerr := read.Run()
			packets := bytes.Count(tout.Bytes(), []byte("\n"))
			// tshark warns when run as root; anything else on stderr is a
			// complaint about the file.
			complaints := strings.TrimSpace(regexp.MustCompile(`(?m)^Running as user .*$`).ReplaceAllString(terr.String(), ""))
			if rerr != nil || complaints != "" {
				t.Fatalf("tshark -r after %v: %v, %d packets, stderr %q", sig, rerr, packets, terr.String())
			}
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rep, err := wire.CheckPcapICRC(f, wire.RoCEv2Port)
			if err != nil || !rep.OK() || rep.Frames != packets {
				t.Fatalf("after %v: ICRC %v %v; tshark %d packets", sig, rep, err, packets)
			}
			fi, _ := os.Stat(file)
			t.Logf("capture after %v: %d bytes, tshark reads %d packets, no cut-short; %v", sig, fi.Size(), packets, rep)
		})
	}
}
