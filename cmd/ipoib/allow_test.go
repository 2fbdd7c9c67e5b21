package main

import (
	"net/netip"
	"slices"
	"testing"
)

// The default allow list is the peers plus the subnet the bind address
// is on: on loopback, 127.0.0.1 is on 127.0.0.0/8.
func TestDefaultAllow(t *testing.T) {
	peer := netip.MustParseAddr("192.0.2.7")
	got, err := defaultAllow(netip.MustParseAddr("127.0.0.1"), []netip.Addr{peer})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("127.0.0.0/8")}
	if !slices.Equal(got, want) {
		t.Fatalf("default allow %v, want %v", got, want)
	}
	if _, err := defaultAllow(netip.MustParseAddr("192.0.2.99"), nil); err == nil {
		t.Fatal("a bind address on no interface gave a default")
	}
}
