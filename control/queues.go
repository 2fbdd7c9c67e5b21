package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// queueCounters renders the stats' queues array (ipoibcm.QueueStats, one
// entry per host queue) under the names ethtool -S gives a multi-queue
// NIC's: tx-N.packets, tx-N.bytes, rx-N.packets, rx-N.bytes. An absent
// array (an engine from before queues) gives none.
func queueCounters(raw json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return out, nil
	}
	var qs []map[string]json.Number
	if err := json.Unmarshal(raw, &qs); err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	for k, q := range qs {
		n := strconv.Itoa(k)
		for _, f := range []struct{ key, name string }{
			{"tx_packets", "tx-" + n + ".packets"}, {"tx_bytes", "tx-" + n + ".bytes"},
			{"rx_packets", "rx-" + n + ".packets"}, {"rx_bytes", "rx-" + n + ".bytes"},
		} {
			if v, ok := q[f.key]; ok {
				out[f.name] = v.String()
			}
		}
	}
	return out, nil
}
