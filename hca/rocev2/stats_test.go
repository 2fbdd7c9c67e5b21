package rocev2

import (
	"encoding/json"
	"testing"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

func TestStatsJSONNamesEveryDropReason(t *testing.T) {
	var s Stats
	s.RxPackets = 7
	s.Drops[wire.DropBadICRC] = 3
	s.Drops[wire.DropUnknownQP] = 1
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		RxPackets uint64            `json:"rx_packets"`
		Drops     map[string]uint64 `json:"rx_drops"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.RxPackets != 7 || got.Drops["bad_icrc"] != 3 || got.Drops["unknown_qp"] != 1 || got.Drops["bad_qkey"] != 0 {
		t.Fatalf("%s", b)
	}
	if len(got.Drops) != int(wire.NumDropReasons)-1 {
		t.Fatalf("%d reasons in %s", len(got.Drops), b)
	}
	if _, ok := got.Drops["none"]; ok {
		t.Fatal("the no-drop reason is listed")
	}
}
