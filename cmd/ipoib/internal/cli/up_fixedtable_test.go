package cli

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2"
)

// On 'ipoib up' the P_Key table is fixed at start (--pkey, --pkey-table):
// a child in a partition outside it is refused, one inside admitted in
// the membership the table gives.
func TestUpChildOutsideTableRefused(t *testing.T) {
	bind := netip.MustParseAddr("127.77.14.1")
	o := upDefaults(netip.AddrPortFrom(bind, borrowPort(t, bind)), nil)
	o.PKey, o.PKeyTable = 0x8001, []hca.PKey{0x0002, 0x8001}
	dcfg, err := upDeviceConfig(o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := dcfg.PKeys; len(got) != 3 || got[0] != 0xffff || got[1] != 0x8001 || got[2] != 0x0002 {
		t.Fatalf("P_Key table %#x, want 0xffff, 0x8001, 0x0002", got)
	}
	dev, err := rocev2.New(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	admit := fixedPKeyTable(dev)
	if _, err := admit(0x8002); err != nil {
		t.Fatalf("partition 0x8002 (limited in the table): %v", err)
	}
	if _, err := admit(0x8003); err == nil || !strings.Contains(err.Error(), "partition 0x8003 is not in this port's P_Key table (0xffff, 0x8001, 0x0002)") {
		t.Fatalf("partition 0x8003: %v", err)
	}
}
