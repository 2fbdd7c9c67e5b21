package cli

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// --recv-queue-size and --recv-queue-max (or their config-file keys) size
// the engine's SRQ, and leave the UD ring at its own size: left unset,
// ipoibcm.Config would size the UD ring as the SRQ.
func TestUpRecvQueueFlagsSizeTheSRQ(t *testing.T) {
	o, err := reloadUp(&Env{}, map[string]string{"addr": "10.77.0.1/24", "bind": "127.0.0.1",
		"recv-queue-size": "512", "recv-queue-max": "1024"})
	if err != nil {
		t.Fatal(err)
	}
	if o.RecvQueueSize != 512 || o.RecvQueueMax != 1024 {
		t.Fatalf("options: recv queue %d, max %d; want 512, 1024", o.RecvQueueSize, o.RecvQueueMax)
	}
	fab := soft.NewFabric(soft.Config{})
	t.Cleanup(func() { fab.Close() })
	dev, err := fab.NewDevice("a")
	if err != nil {
		t.Fatal(err)
	}
	host, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("10.77.0.1/24")}, MTU: 65520})
	if err != nil {
		t.Fatal(err)
	}
	cfg := upInterfaceConfig(o, ipoibcm.ModeConnected, dev, host, slog.New(slog.DiscardHandler))
	if cfg.UDRecvQueueSize != ipoibcm.DefaultUDRecvQueueSize {
		t.Fatalf("UD ring %d, want its own default %d", cfg.UDRecvQueueSize, ipoibcm.DefaultUDRecvQueueSize)
	}
	ifc, err := ipoibcm.New(cfg)
	if err != nil {
		host.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { ifc.Close() })
	if st := ifc.Stats(); st.SRQSize != 512 || st.SRQPosted != 512 {
		t.Fatalf("SRQ of %d buffers, %d posted; want 512", st.SRQSize, st.SRQPosted)
	}
}
