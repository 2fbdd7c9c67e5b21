package frame

import (
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func gidOf(s string) hca.GID { return hca.GIDFromAddr(netip.MustParseAddr(s)) }

func TestHWAddrGolden(t *testing.T) {
	// The 20-byte hardware address of docs/wire.md §1, worked by hand:
	// RC-capable, UD QPN 0x48, GID ::ffff:127.0.0.1.
	a := NewHWAddr(FlagRC, 0x48, gidOf("127.0.0.1"))
	const want = "8000004800000000000000000000ffff7f000001"
	if got := a.String(); got != want {
		t.Fatalf("String() = %s, want %s", got, want)
	}
	if got, want := a.ColonString(), "80:00:00:48:00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01"; got != want {
		t.Fatalf("ColonString() = %s, want %s", got, want)
	}
	if HWAddr(mustHex(t, want)) != a {
		t.Fatalf("bytes differ from golden")
	}
	if a.Flags() != 0x80 || !a.Connected() || a.QPN() != 0x48 || a.IsMulticast() || a.IsZero() {
		t.Fatalf("accessors: flags %#x connected %v qpn %#x mcast %v", a.Flags(), a.Connected(), a.QPN(), a.IsMulticast())
	}
	if a.GID() != gidOf("127.0.0.1") {
		t.Fatalf("GID() = %v", a.GID())
	}
}

func TestHWAddrQPNMasked(t *testing.T) {
	// A QPN wider than 24 bits must not spill into the flags byte.
	a := NewHWAddr(0, 0x7F123456, hca.GID{})
	if a.Flags() != 0 || a.QPN() != 0x123456 || a.Connected() {
		t.Fatalf("flags %#x qpn %#x", a.Flags(), a.QPN())
	}
	b := NewHWAddr(FlagUC, hca.QPNMulticast, hca.GID{})
	if b.Flags() != FlagUC || b.Connected() || b.QPN() != 0xFFFFFF {
		t.Fatalf("flags %#x qpn %#x", b.Flags(), b.QPN())
	}
}

func TestUDMTU(t *testing.T) {
	for _, c := range []struct {
		ib   hca.MTU
		want int
	}{{hca.MTU2048, 2044}, {hca.MTU4096, 4092}, {hca.MTU256, 252}} {
		if got := UDMTU(c.ib); got != c.want {
			t.Errorf("UDMTU(%d) = %d, want %d", c.ib, got, c.want)
		}
	}
	if CMBufSize != 0xFFF4 || CMMTU != 65520 {
		t.Errorf("CMBufSize %#x CMMTU %d", CMBufSize, CMMTU)
	}
}
