package ipoibcm

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca/cm"
)

// TestStatsSchemaStable checks the promise 'ipoib show --json' makes:
// a fresh interface, with nothing counted yet, already has every key, so
// a script never meets a key that appears only once a counter moved.
func TestStatsSchemaStable(t *testing.T) {
	fab := rvFabric(t, 1)
	ifc := rvStart(t, fab, "h1", newMemPort(1, nil), nil)
	b, err := json.Marshal(ifc.Stats())
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"cm", "counters", "drops", "host_link", "hwaddr", "link_up", "mcast_groups", "mode", "mtu", "name", "napi",
		"neighbours", "offloads", "queues", "reaper", "rx_conns", "rx_limits", "srq_grown", "srq_posted", "srq_size", "tx_conns", "tx_outstanding"}
	if !slices.Equal(keys, want) {
		t.Fatalf("top-level keys %v, want %v", keys, want)
	}
	drops := top["drops"].(map[string]any)
	if len(drops) != int(numDropReasons) {
		t.Fatalf("%d drop reasons in JSON, want all %d: %v", len(drops), numDropReasons, drops)
	}
	for r := range numDropReasons {
		if v, ok := drops[r.String()]; !ok || v.(float64) != 0 {
			t.Errorf("drop %s = %v (present %v), want 0", r, v, ok)
		}
	}
	for _, k := range []string{"neighbours", "tx_conns", "rx_conns", "mcast_groups"} {
		if _, ok := top[k].([]any); !ok {
			t.Errorf("%s is %v, want an array (empty, not null)", k, top[k])
		}
	}
	cmj := top["cm"].(map[string]any)
	for _, k := range []string{"sent", "received", "dropped", "rej_sent", "rej_received", "req_outcomes"} {
		m, ok := cmj[k].(map[string]any)
		if !ok || len(m) == 0 {
			t.Errorf("cm.%s = %v, want every key with 0", k, cmj[k])
		}
	}
	if _, ok := cmj["sent"].(map[string]any)[cm.MsgDREQ.String()]; !ok {
		t.Errorf("cm.sent lacks %s", cm.MsgDREQ)
	}
}
