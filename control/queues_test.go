package control

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestQueueCountersNamedAsEthtool: show prints each host queue's counters
// under queues: as ethtool -S names a multi-queue NIC's, show -S as
// top-level tx-N/rx-N lines, and a stats without queues shows none.
func TestQueueCountersNamedAsEthtool(t *testing.T) {
	stats := `{"counters": {"rx_packets": 1}, "queues": [
		{"tx_packets": 10, "tx_bytes": 1000, "rx_packets": 20, "rx_bytes": 2000},
		{"tx_packets": 11, "tx_bytes": 1100, "rx_packets": 0, "rx_bytes": 0}]}`
	snap := InterfaceStats{Interface: InterfaceInfo{Host: "h1", Name: "ib0"}, Stats: json.RawMessage(stats)}
	var b bytes.Buffer
	if err := Format(&b, snap); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"    queues:\n", "        tx-0.packets: 10\n", "        rx-0.bytes: 2000\n", "        tx-1.bytes: 1100\n"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("show lacks %q:\n%s", w, b.String())
		}
	}
	if strings.Contains(b.String(), "rx-1.packets") {
		t.Errorf("show prints a zero queue counter without -s:\n%s", b.String())
	}
	b.Reset()
	if err := FormatFlat(&b, []InterfaceStats{snap}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"     tx-1.packets: 11\n", "     rx-1.packets: 0\n", "     rx-0.packets: 20\n"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("show -S lacks %q:\n%s", w, b.String())
		}
	}
	if kv, err := queueCounters(nil); err != nil || len(kv) != 0 {
		t.Errorf("no queues array: %v, %v", kv, err)
	}
	if _, err := queueCounters(json.RawMessage(`{"tx_packets": 1}`)); err == nil {
		t.Error("queues as an object formatted without error")
	}
}
