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
	// 127.78.0.1 is on lo's 127.0.0.0/8 without being its address.
	if got, err := defaultAllow(netip.MustParseAddr("127.78.0.1"), nil); err != nil || !slices.Equal(got, want[1:]) {
		t.Fatalf("default allow for a loopback address: %v, %v", got, err)
	}
	// 198.18.0.0/15 is for benchmarks between networks: on no interface
	// here.
	if _, err := defaultAllow(netip.MustParseAddr("198.19.254.253"), nil); err == nil {
		t.Fatal("a bind address on no interface gave a default")
	}
}
