package control

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

const hwA = "00:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:0a:62:3e:02"

func peerSnap(t *testing.T, stats string) InterfaceStats {
	t.Helper()
	if !json.Valid([]byte(stats)) {
		t.Fatalf("bad test JSON %s", stats)
	}
	return InterfaceStats{Interface: InterfaceInfo{Host: "h1", Name: "ib0"}, Stats: json.RawMessage(stats)}
}

func TestPeersAndFormat(t *testing.T) {
	s := peerSnap(t, `{"neighbours":[{"ips":["10.77.0.2"],"hwaddr":"`+hwA+`"}],
		"tx_conns":[{"peer":"`+hwA+`","peer_gid":"fe80::a62:3e02","state":"up","bytes":1000}],
		"rx_conns":[{"peer":"`+hwA+`","peer_gid":"fe80::a62:3e02","state":"error","bytes":5},{"peer":"`+hwA+`","peer_gid":"fe80::a62:3e02","state":"live","bytes":70}],
		"peer_activity":{"`+hwA+`":{"last_rx_ms":2400,"sample_ms":1000,"retransmits":3}},
		"counters":{"rx_packets":7,"tx_packets":9},"link_up":true,"mode":"connected"}`)
	ps, err := Peers(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("peers %+v", ps)
	}
	p := ps[0]
	if p.GID != "fe80::a62:3e02" || p.TX != "up" || p.RX != "live" || p.TXBytes != 1000 || p.RXBytes != 75 || p.IPs[0] != "10.77.0.2" || p.Activity.Retransmits != 3 {
		t.Fatalf("peer %+v", p)
	}
	var out bytes.Buffer
	if err := FormatPeers(&out, []InterfaceStats{s}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "HOST") {
		t.Fatalf("show peers:\n%s", out.String())
	}
	for _, want := range []string{"h1", "ib0", "fe80::a62:3e02", "10.77.0.2", hwA, "up", "live", "2s ago", "1000", "75", " 3"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("peer line lacks %q: %s", want, lines[1])
		}
	}
	out.Reset()
	if err := FormatFlat(&out, []InterfaceStats{s}); err != nil {
		t.Fatal(err)
	}
	want := "h1 ib0:\n     counters.rx_packets: 7\n     counters.tx_packets: 9\n     link_up: 1\n"
	if out.String() != want {
		t.Fatalf("show -S:\n%s\nwant:\n%s", out.String(), want)
	}
}

// A host that does not track activity (a fabric host) shows n/a; a
// neighbour with no connection shows "-" both ways; the GID comes from
// the hardware address then.
func TestPeersWithoutActivity(t *testing.T) {
	ps, err := Peers(peerSnap(t, `{"neighbours":[{"ips":["10.77.0.2"],"hwaddr":"`+hwA+`"}]}`))
	if err != nil || len(ps) != 1 || ps[0].TX != "-" || ps[0].RX != "-" || ps[0].Activity != nil || ps[0].GID != "fe80:0000:0000:0000:0000:0000:0a62:3e02" {
		t.Fatalf("%+v %v", ps, err)
	}
	var out bytes.Buffer
	if err := FormatPeers(&out, []InterfaceStats{peerSnap(t, `{"neighbours":[{"ips":[],"hwaddr":"`+hwA+`"}]}`)}); err != nil || !strings.Contains(out.String(), "n/a") {
		t.Fatalf("%v:\n%s", err, out.String())
	}
}

// FuzzPeers: any stats JSON gives peers or an error, and FormatFlat and
// FormatPeers never panic.
func FuzzPeers(f *testing.F) {
	f.Add([]byte(`{"neighbours":[{"ips":["a"],"hwaddr":"x"}],"tx_conns":[{"peer":"x","state":"up","bytes":1}]}`))
	f.Add([]byte(`{"a":{"b":1.5,"c":true},"peer_activity":{"x":{"last_rx_ms":-1}}}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := InterfaceStats{Interface: InterfaceInfo{Host: "h", Name: "ib0"}, Stats: json.RawMessage(b)}
		Peers(s)
		var out bytes.Buffer
		FormatFlat(&out, []InterfaceStats{s})
		FormatPeers(&out, []InterfaceStats{s})
	})
}
