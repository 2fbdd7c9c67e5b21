package soak

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/internal/testutil"
)

// TestSoakCaptureDecodes runs a short soak with the dead flag switched off
// (so an invariant breaks and the capture ring is written) and reads the
// file back with tshark: the CM handshake and teardown, RC SENDs, UD
// IPoIB ARP, no malformed packet, every ICRC valid (checked by the
// project's own ICRC code, which tshark lacks), and the engine's
// comments tracing a reaped QPN through its drain.
func TestSoakCaptureDecodes(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt-get install tshark)")
	}
	file := filepath.Join(t.TempDir(), "soak.pcapng")
	cfg := shortSoak(t, func(p Progress) bool {
		return len(p.Violations) > 0 && p.Engine.TXTeardowns > 0 && p.Engine.DrainsCompleted > 0
	})
	cfg.Hosts = 6
	cfg.MaxPacket = 3000 // small records: the ring holds the whole run
	cfg.Mutations.SkipDeadFlag = true
	cfg.Capture = file
	cfg.CapturePackets = 200000
	rep := runSoakT(t, cfg)
	if !rep.Failed() {
		t.Fatalf("the mutation broke no invariant in %v; no capture to read", rep.Elapsed)
	}
	if rep.CaptureFile != file || rep.CaptureBytes == 0 {
		t.Fatalf("capture not written: %q %d bytes", rep.CaptureFile, rep.CaptureBytes)
	}

	fields := func(filter string, f ...string) [][]string {
		t.Helper()
		return testutil.TsharkFields(t, tshark, []string{"-r", file}, filter, f...)
	}
	count := func(filter string) int { return len(fields(filter, "frame.number")) }
	for _, c := range []struct{ what, filter string }{
		{"CM REQ", "infiniband.mad.attributeid == 0x0010"},
		{"CM REP", "infiniband.mad.attributeid == 0x0013"},
		{"CM RTU", "infiniband.mad.attributeid == 0x0014"},
		{"CM DREQ", "infiniband.mad.attributeid == 0x0015"},
		{"RC SEND", "infiniband.bth.opcode == 4 || infiniband.bth.opcode == 0"},
		{"RC ACK", "infiniband.bth.opcode == 17"},
		{"UD IPoIB ARP", "infiniband.bth.opcode == 100 && arp.hw.type == 32"},
		{"IPv4 inside RC", "infiniband.bth.opcode == 4 && ip"},
		{"engine comment", "frame.comment"},
	} {
		if n := count(c.filter); n == 0 {
			t.Errorf("no %s in the capture (%s)", c.what, c.filter)
		} else {
			t.Logf("%-15s %6d frames", c.what, n)
		}
	}
	if n := count("_ws.malformed"); n != 0 {
		t.Errorf("%d malformed frames: %v", n, fields("_ws.malformed", "frame.number", "_ws.col.Info"))
	}

	// Every ICRC, with the check hca/rocev2/cmd/icrccheck makes (tshark
	// shows the ICRC but never verifies it).
	pf, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	icrc, err := wire.CheckPcapICRC(pf, wire.RoCEv2Port)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ICRC: %v", icrc)
	if !icrc.OK() || icrc.Good != icrc.RoCEv2 {
		t.Errorf("ICRC check: %v", icrc)
	}

	// A reaped QPN whose drain was posted and completed before.
	comments := fields("frame.comment", "frame.comment")
	seen := map[string]map[string]bool{}
	re := regexp.MustCompile(`^(\S+): (drain_posted|drain_completed|reaped) qpn (0x[0-9a-f]+)`)
	for _, row := range comments {
		m := re.FindStringSubmatch(row[0])
		if m == nil {
			continue
		}
		key := m[1] + " " + m[3]
		if seen[key] == nil {
			seen[key] = map[string]bool{}
		}
		if m[2] == "reaped" && !(seen[key]["drain_posted"] && seen[key]["drain_completed"]) {
			seen[key]["reaped_early"] = true
		}
		seen[key][m[2]] = true
	}
	traced := ""
	for k, s := range seen {
		if s["drain_posted"] && s["drain_completed"] && s["reaped"] && !s["reaped_early"] {
			traced = k
			break
		}
	}
	if traced == "" {
		t.Fatalf("no QPN traced through drain_posted, drain_completed, reaped in %d comments", len(comments))
	}
	t.Logf("traced %s through its drain", traced)
	if count(`frame.comment contains "VIOLATION"`) == 0 {
		t.Error("the violation is not marked in the capture")
	}
}
