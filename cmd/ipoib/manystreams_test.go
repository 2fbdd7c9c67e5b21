package main

import (
	"os/exec"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// TestBinaryConnectedManyStreamsOneConnection: eight TCP streams over
// connected-mode ib0 (iperf3 -P 8) ride one RC connection from start to
// end. Eight streams keep more 64 KiB segments in flight than Linux's SRQ
// of 256 holds, and the peer asks for RNR retry 0, so with a fixed SRQ a
// receiver that falls behind fails the sender's QP: tx_send_error, a
// teardown, a reconnect (seven of them in 4 s on a quiet machine, and
// iperf3 -P 8 moved half of -P 1). The SRQ grows instead (ipoibcm/srq.go).
func TestBinaryConnectedManyStreamsOneConnection(t *testing.T) {
	h1, h2, ctl := iperf3Fabric(t, "p", "10.77.94.0/24")
	a2 := "10.77.94.2"
	if out, err := exec.Command("ip", "netns", "exec", h1, "ping", "-c", "1", "-w", "10", a2).CombinedOutput(); err != nil {
		t.Fatalf("ping %s: %v %s", a2, err, out)
	}
	const seconds = 4
	r := iperf3Across(t, h1, h2, a2, seconds, "-P", "8")
	_, tx := hostStats(t, ctl, h1)
	_, rx := hostStats(t, ctl, h2)
	num := func(st map[string]any, path ...string) float64 { return testutil.JSONNumber(t, st, path...) }
	t.Logf("-P 8: %.2f Gbit/s; receiver's SRQ %v buffers (grown %v times); sender: %v connects, %v send errors",
		r.End.SumReceived.BitsPerSecond/1e9, num(rx, "srq_size"), num(rx, "srq_grown"),
		num(tx, "reaper", "tx_connects"), num(tx, "drops", "tx_send_error"))
	if n := num(tx, "drops", "tx_send_error"); n != 0 {
		t.Errorf("sender: tx_send_error %v, want 0 (a receive found the SRQ empty)", n)
	}
	if n := num(tx, "reaper", "tx_connects"); n != 1 {
		t.Errorf("sender: %v connections made, want the one", n)
	}
	if n := num(rx, "reaper", "reaped"); n != 0 {
		t.Errorf("receiver: %v passive connections reaped, want 0", n)
	}
	if size, posted := num(rx, "srq_size"), num(rx, "srq_posted"); size < 256 || posted > size {
		t.Errorf("receiver: SRQ %v posted of %v", posted, size)
	}
}
