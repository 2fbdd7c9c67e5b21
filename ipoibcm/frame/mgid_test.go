package frame

import (
	"net/netip"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func TestMGIDTable(t *testing.T) {
	// MGIDs of IP groups (RFC 4391; docs/wire.md §1), worked by hand with
	// P_Key 0xFFFF.
	for _, c := range []struct{ group, mgid string }{
		{"224.0.0.1", "ff12:401b:ffff:0000:0000:0000:0000:0001"},
		{"239.1.2.3", "ff12:401b:ffff:0000:0000:0000:0f01:0203"},
		{"255.255.255.255", "ff12:401b:ffff:0000:0000:0000:ffff:ffff"},
		{"::ffff:239.1.2.3", "ff12:401b:ffff:0000:0000:0000:0f01:0203"},
		{"ff02::1", "ff12:601b:ffff:0000:0000:0000:0000:0001"},
		{"ff02::1:ff00:2", "ff12:601b:ffff:0000:0000:0001:ff00:0002"},
	} {
		got := MulticastMGID(netip.MustParseAddr(c.group), hca.PKeyDefault)
		if want := gidOf(c.mgid); got != want {
			t.Errorf("MulticastMGID(%s) = %v, want %v", c.group, got, want)
		}
	}
}

func TestBroadcast(t *testing.T) {
	if got, want := BroadcastMGID(hca.PKeyDefault), gidOf("ff12:401b:ffff::ffff:ffff"); got != want {
		t.Fatalf("BroadcastMGID = %v, want %v", got, want)
	}
	// The full-membership bit is always set, as Linux does.
	if got, want := BroadcastMGID(0x0001), gidOf("ff12:401b:8001::ffff:ffff"); got != want {
		t.Fatalf("BroadcastMGID(0x0001) = %v, want %v", got, want)
	}
	// The Linux/wicked constant with P_Key 0xffff in bytes 8-9.
	a := BroadcastHWAddr(hca.PKeyDefault)
	if a.String() != "00ffffffff12401bffff000000000000ffffffff" {
		t.Fatalf("BroadcastHWAddr = %s", a)
	}
	if !a.IsMulticast() || a.QPN() != hca.QPNMulticast || a.Connected() {
		t.Fatalf("broadcast accessors wrong: %s", a)
	}
	m := MulticastHWAddr(netip.MustParseAddr("ff02::1"), 0x8002)
	if m.String() != "00ffffffff12601b800200000000000000000001" || !m.IsMulticast() {
		t.Fatalf("MulticastHWAddr = %s", m)
	}
}
