package control

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// sampleStats has the shape ipoibcm.Stats marshals to.
const sampleStats = `{
 "Counters": {"rx_packets": 1500, "tx_packets": 1400, "rx_bytes": 2250000, "tx_bytes": 2100000,
              "tx_errors": 1, "rx_dropped": 2, "tx_dropped": 3, "multicast": 4, "rx_dead_dropped": 5},
 "Drops": {"tx_unknown_ethertype": 3, "rx_own_echo": 7, "tx_vlan": 0},
 "Neighbours": [{"ips": ["10.77.0.2", "fe80::2"], "hwaddr": "80:00:00:49:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02", "mac": "02:00:00:00:00:01", "connected": true, "tx_conn": "established", "idle_ms": 1500}],
 "TXConns": [{"Peer": "10.77.0.2", "LocalQPN": 73, "RemoteQPN": 88, "State": "established", "age_ms": 61000, "idle_ms": 250, "Packets": 1400, "Bytes": 2100000}],
 "RXConns": [],
 "mcast_groups": [{"mgid": "ff12:401b:ffff::f01:203", "state": "full", "groups": ["239.1.2.3"], "attached": true, "age_ms": 2000, "idle_ms": 0}],
 "NAPI": {"RX": {"polls": 90, "completions": 1500}, "TX": {"polls": 80}},
 "Reaper": {"stale_scans": 2, "reaped": 1},
 "CM": null,
 "tx_outstanding": 3,
 "mode": "connected"
}`

func TestFormatShow(t *testing.T) {
	var b bytes.Buffer
	err := Format(&b, InterfaceStats{
		Interface: InterfaceInfo{Host: "ipoib-h1", Name: "ib0", Mode: "connected", MTU: 65520, LinkUp: true,
			HWAddr: "80:00:00:48", Addrs: []string{"10.77.0.1/24"}},
		Stats: json.RawMessage(sampleStats),
	})
	if err != nil {
		t.Fatalf("format: %v", err)
	}
	out := b.String()
	lines := strings.Split(out, "\n")
	if lines[0] != "ipoib-h1: ib0: <UP> mode connected mtu 65520" {
		t.Fatalf("header %q", lines[0])
	}
	wantContains := []string{
		"    link/infiniband 80:00:00:48\n",
		"    inet 10.77.0.1/24\n",
		"        tx_unknown_ethertype: 3\n",
		"        rx_own_echo: 7\n",
		"        rx.polls: 90\n",
		"        rx.completions: 1500\n",
		"        tx.polls: 80\n",
		"        stale_scans: 2\n",
		"    rx connections: none\n",
		"    interface:\n        tx_outstanding: 3\n",
		"    tx connections (1):\n",
		"    neighbours (1):\n",
		"    multicast groups (1):\n        MGID                     GROUPS     STATE  AGE  IDLE  ATTACHED\n        ff12:401b:ffff::f01:203  239.1.2.3  full   2s   0s    true\n",
	}
	for _, w := range wantContains {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q\n%s", w, out)
		}
	}
	// The RX block: header names then values, right-aligned in columns.
	rx := fieldsAfter(t, lines, "RX:")
	if strings.Join(rx[0], " ") != "RX: bytes packets dropped multicast dead_dropped" {
		t.Errorf("RX header %v", rx[0])
	}
	if strings.Join(rx[1], " ") != "2250000 1500 2 4 5" {
		t.Errorf("RX values %v", rx[1])
	}
	tx := fieldsAfter(t, lines, "TX:")
	if strings.Join(tx[0], " ") != "TX: bytes packets errors dropped" || strings.Join(tx[1], " ") != "2100000 1400 1 3" {
		t.Errorf("TX block %v", tx)
	}
	// Connection table: preferred columns first, durations rendered.
	conn := fieldsAfter(t, lines, "PEER ")
	if strings.Join(conn[0], " ") != "PEER LOCALQPN REMOTEQPN STATE AGE IDLE PACKETS BYTES" {
		t.Errorf("conn columns %v", conn[0])
	}
	if strings.Join(conn[1], " ") != "10.77.0.2 73 88 established 1m1s 250ms 1400 2100000" {
		t.Errorf("conn row %v", conn[1])
	}
	// Drops are sorted by name like ethtool -S.
	if strings.Index(out, "rx_own_echo") > strings.Index(out, "tx_unknown_ethertype") {
		t.Error("drops not sorted")
	}
	if strings.Contains(out, "    cm:") {
		t.Error("null CM section printed")
	}
	// Addresses as plain text, idle time instead of a stamp.
	neigh := fieldsAfter(t, lines, "IPS ")
	if strings.Join(neigh[0], " ") != "IPS MAC HWADDR CONNECTED TX_CONN IDLE" ||
		strings.Join(neigh[1], " ") != "10.77.0.2,fe80::2 02:00:00:00:00:01 80:00:00:49:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02 true established 1.5s" {
		t.Errorf("neighbour table %v", neigh)
	}
	// Zero counters are hidden by default and shown with -s.
	if strings.Contains(out, "tx_vlan") {
		t.Error("zero drop tx_vlan printed without ShowZero")
	}
	var all bytes.Buffer
	if err := (FormatOptions{ShowZero: true}).Format(&all, InterfaceStats{Interface: InterfaceInfo{Host: "h"}, Stats: json.RawMessage(sampleStats)}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(all.String(), "        tx_vlan: 0\n") {
		t.Errorf("ShowZero output lacks tx_vlan: 0\n%s", all.String())
	}
}

// fieldsAfter returns the whitespace-split fields of the line starting
// with marker (after trimming) and of the line following it.
func fieldsAfter(t *testing.T, lines []string, marker string) [2][]string {
	t.Helper()
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), marker) && i+1 < len(lines) {
			return [2][]string{strings.Fields(l), strings.Fields(lines[i+1])}
		}
	}
	t.Fatalf("no line starting with %q", marker)
	return [2][]string{}
}

func TestFormatRejectsMalformedStats(t *testing.T) {
	for _, bad := range []string{`[1,2]`, `{"Counters": [1]}`, `{"TXConns": {"a":1}}`, `{"Drops": "x"}`} {
		err := Format(&bytes.Buffer{}, InterfaceStats{Interface: InterfaceInfo{Host: "h"}, Stats: json.RawMessage(bad)})
		if err == nil {
			t.Errorf("stats %s formatted without error", bad)
		}
	}
}

func TestRenderDuration(t *testing.T) {
	if got := renderValue("age", json.Number("1500000000")); got != (1500 * time.Millisecond).String() {
		t.Fatalf("age rendered %q", got)
	}
	if got := renderValue("idle_ms", json.Number("61000")); got != "1m1s" {
		t.Fatalf("idle_ms rendered %q", got)
	}
	if got := renderValue("packets", json.Number("1500000000")); got != "1500000000" {
		t.Fatalf("packets rendered %q", got)
	}
}

func FuzzFormat(f *testing.F) {
	f.Add([]byte(sampleStats))
	f.Add([]byte(`{"NAPI":{"RX":{"x":[1,{"y":null}]}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		// None may panic.
		s := InterfaceStats{Stats: b}
		Format(&bytes.Buffer{}, s)
		FormatOptions{ShowZero: true}.Format(&bytes.Buffer{}, s)
		FormatBrief(&bytes.Buffer{}, []InterfaceStats{s})
		FormatRates(&bytes.Buffer{}, Sample{Stats: []InterfaceStats{s}}, Sample{At: time.Unix(1, 0), Stats: []InterfaceStats{s}})
	})
}
