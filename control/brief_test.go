package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

func snapshot(host string, rxPkts, txPkts, rxBytes, drops uint64, txConns int) InterfaceStats {
	conns := strings.TrimSuffix(strings.Repeat(`{"peer":"x"},`, txConns), ",")
	raw := fmt.Sprintf(`{"counters":{"rx_packets":%d,"tx_packets":%d,"rx_bytes":%d,"tx_bytes":0,"rx_dropped":%d,"tx_dropped":1},"tx_conns":[%s],"rx_conns":[],"mcast_groups":[{"state":"default"},{"state":"full"},{"state":"send-only"}]}`,
		rxPkts, txPkts, rxBytes, drops, conns)
	return InterfaceStats{
		Interface: InterfaceInfo{Host: host, Name: "ib0", Mode: "connected", MTU: 65520, LinkUp: true, PKey: "0xffff", Membership: "full"},
		Stats:     json.RawMessage(raw),
	}
}

func TestBriefHundredHostsFitsInHundredOneLines(t *testing.T) {
	var all []InterfaceStats
	for i := 100; i >= 1; i-- { // reversed: SortInterfaces must put h2 before h10
		all = append(all, snapshot(fmt.Sprintf("ipoib-h%d", i), uint64(i), 2*uint64(i), 0, 3, i%4))
	}
	SortInterfaces(all)
	var b bytes.Buffer
	if err := FormatBrief(&b, all); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 101 {
		t.Fatalf("%d lines for 100 hosts, want 101:\n%s", len(lines), b.String())
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "HOST IFACE PKEY MEMBER MODE MTU STATE RX-PACKETS TX-PACKETS DROPS CONNS(TX/RX) MCAST(FULL/SO)" {
		t.Fatalf("header %q", lines[0])
	}
	if got := strings.Join(strings.Fields(lines[2]), " "); got != "ipoib-h2 ib0 0xffff full connected 65520 UP 2 4 4 2/0 2/1" {
		t.Fatalf("second host line %q", got)
	}
	if !strings.HasPrefix(lines[100], "ipoib-h100 ") {
		t.Fatalf("last line %q", lines[100])
	}
}

func TestRatesPerSecond(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := Sample{At: t0, Stats: []InterfaceStats{snapshot("h1", 100, 0, 1000, 5, 1)}}
	cur := Sample{At: t0.Add(2 * time.Second), Stats: []InterfaceStats{
		snapshot("h1", 300, 50, 1000+250000, 9, 1), // +200 pkts, +2 Mbit, +4 drops in 2 s
		snapshot("h2", 7, 7, 7, 0, 0),              // new: no rate yet
	}}
	var b bytes.Buffer
	if err := FormatRates(&b, prev, cur); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("rates:\n%s", b.String())
	}
	if got := strings.Join(strings.Fields(lines[1]), " "); got != "h1 ib0 UP 100.0 25.0 1.0 0.0 2.0 1/0" {
		t.Errorf("h1 rates %q", got)
	}
	if got := strings.Join(strings.Fields(lines[2]), " "); got != "h2 ib0 UP - - - - - 0/0" {
		t.Errorf("h2 rates %q", got)
	}
}

func TestBriefRejectsMalformedStats(t *testing.T) {
	bad := InterfaceStats{Interface: InterfaceInfo{Host: "h"}, Stats: json.RawMessage(`{"counters":[1]}`)}
	if err := FormatBrief(&bytes.Buffer{}, []InterfaceStats{bad}); err == nil {
		t.Fatal("malformed counters accepted")
	}
	if err := FormatRates(&bytes.Buffer{}, Sample{}, Sample{Stats: []InterfaceStats{bad}}); err == nil {
		t.Fatal("malformed counters accepted by rates")
	}
}
