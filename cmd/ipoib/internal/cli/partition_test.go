package cli

import (
	"net/netip"
	"strings"
	"testing"
)

func TestPartitionFlag(t *testing.T) {
	var p partitionsFlag
	for _, v := range []string{"0x8001=1,2,3:limited", "32770=4:full"} {
		if err := p.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	if got := p.String(); got != "0x8001=1,2,3:limited 0x8002=4" {
		t.Fatalf("String() = %q", got)
	}
	if msg := p.check(4, netip.MustParsePrefix("10.77.0.0/24")); msg != "" {
		t.Fatal(msg)
	}
	if msg := p.check(3, netip.MustParsePrefix("10.77.0.0/24")); !strings.Contains(msg, "host 4, but --hosts is 3") {
		t.Fatalf("check with 3 hosts: %q", msg)
	}
	sub, err := partitionPrefix(netip.MustParsePrefix("10.77.0.0/24"), 2)
	if err != nil || sub.String() != "10.77.2.0/24" {
		t.Fatalf("second subnet %v %v", sub, err)
	}
	reqs, err := p.parts[0].childRequests("ib0", netip.MustParsePrefix("10.77.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if r := reqs[3]; r.PKey != 0x0001 || r.Name != "ib0.8001" || r.Addrs[0] != "10.77.1.3/24" {
		t.Fatalf("limited member's request %+v", r)
	}
	if r := reqs[1]; r.PKey != 0x8001 || r.Addrs[0] != "10.77.1.1/24" {
		t.Fatalf("full member's request %+v", r)
	}
}

func FuzzPartitionFlag(f *testing.F) {
	for _, s := range []string{"0x8001=1,2", "0x8001=1:limited", "0x0001=1", "=", "0x8001=", "0x8001=255", "0x8001=1,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var p partitionsFlag
		if err := p.Set(s); err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("two-line error %q", err)
			}
			return
		}
		pt := p.parts[0]
		if pt.pkey&0x8000 == 0 || pt.pkey&0x7FFF == 0 || len(pt.members) == 0 {
			t.Fatalf("accepted %q as %+v", s, pt)
		}
		for _, m := range pt.members {
			if m.host < 1 || m.host > maxHosts {
				t.Fatalf("accepted host %d in %q", m.host, s)
			}
		}
	})
}
