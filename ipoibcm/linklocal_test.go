package ipoibcm

import (
	"net/netip"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func TestLinkLocalFromGID(t *testing.T) {
	// addrconf_ifid_infiniband: dev_addr + 12 (the GID's interface ID),
	// eui[0] |= 2.
	for _, tc := range []struct{ gid, want string }{
		{"::ffff:10.99.0.1", "fe80::200:ffff:a63:1"},
		{"fe80::202:c903:a:b1c2", "fe80::202:c903:a:b1c2"}, // bit already set
		{"fe80::1", "fe80::200:0:0:1"},
	} {
		gid := hca.GIDFromAddr(netip.MustParseAddr(tc.gid))
		if got := LinkLocal(gid); got != netip.MustParseAddr(tc.want) {
			t.Errorf("LinkLocal(%s) = %v, want %s", tc.gid, got, tc.want)
		}
	}
}
