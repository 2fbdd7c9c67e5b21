package main

import (
	"os/exec"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// TestBinaryMultiQueueIperf: 'ipoib fabric --queues 2' under iperf3 -P 4
// spreads the streams over both queues of each ib0, both ways: the
// sender's readers read the data on more than one queue (tx-N) and the
// receiver's writers write it on more than one (rx-N), and the ACKs do
// the same in the other direction. Nothing fails to send, and the bytes
// iperf3 sent arrived.
func TestBinaryMultiQueueIperf(t *testing.T) {
	h1, h2, ctl := iperf3Fabric(t, "q", "10.77.95.0/24", "--queues", "2")
	a2 := "10.77.95.2"
	if out, err := exec.Command("ip", "netns", "exec", h1, "ping", "-c", "1", "-w", "10", a2).CombinedOutput(); err != nil {
		t.Fatalf("ping %s: %v %s", a2, err, out)
	}
	// The streams take ports 40000..40003 (iperf3 --cport with -P), which
	// flowQueue (ipoibcm/hostqueue.go) puts on both queues; the kernel
	// follows: its tun flow table sends a flow on the queue the engine
	// last wrote it to. Ephemeral ports would leave all four on one queue
	// one run in eight.
	r := iperf3Across(t, h1, h2, a2, 3, "-P", "4", "--cport", "40000")
	_, tx := hostStats(t, ctl, h1)
	_, rx := hostStats(t, ctl, h2)
	num := func(st map[string]any, path ...string) float64 { return testutil.JSONNumber(t, st, path...) }
	// busy is how many of st's queues moved at least 100 frames of dir
	// ("tx_packets" read from the host, "rx_packets" written to it).
	busy := func(name string, st map[string]any, dir string) int {
		qs, ok := st["queues"].([]any)
		if !ok || len(qs) != 2 {
			t.Fatalf("%s: queues %v, want 2 entries", name, st["queues"])
		}
		n, per := 0, []float64{}
		for _, q := range qs {
			v := testutil.JSONNumber(t, q, dir)
			if v >= 100 {
				n++
			}
			per = append(per, v)
		}
		t.Logf("%s %s per queue: %v", name, dir, per)
		return n
	}
	for _, c := range []struct {
		name string
		st   map[string]any
		dir  string
	}{{"sender", tx, "tx_packets"}, {"receiver", rx, "rx_packets"}, {"receiver (ACKs)", rx, "tx_packets"}, {"sender (ACKs)", tx, "rx_packets"}} {
		if n := busy(c.name, c.st, c.dir); n < 2 {
			t.Errorf("%s: %d of 2 queues carried %s", c.name, n, c.dir)
		}
	}
	for name, st := range map[string]map[string]any{"sender": tx, "receiver": rx} {
		if n := num(st, "drops", "tx_send_error") + num(st, "drops", "tx_post_failed") + num(st, "counters", "tx_errors"); n != 0 {
			t.Errorf("%s: %v send errors (tx_send_error, tx_post_failed, tx_errors), want 0", name, n)
		}
	}
	// The sender counts what it wrote to its sockets, some of which is
	// still in flight when the test ends.
	if got, sent := r.End.SumReceived.Bytes, r.End.SumSent.Bytes; got == 0 || got < 0.9*sent {
		t.Errorf("iperf3: %v bytes received of %v sent", got, sent)
	}
	t.Logf("-P 4 over 2 queues: %.2f Gbit/s", r.End.SumReceived.BitsPerSecond/1e9)
}
