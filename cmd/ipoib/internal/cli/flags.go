package cli

import (
	"flag"
	"log/slog"
	"strings"

	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// fabricIBMTU is the soft fabric's port MTU, which bounds datagram mode's
// IP MTU on the fabric (internal/flagcheck.MTU).
const fabricIBMTU = 4096

// ibFlags are the flags of an ib0 that 'fabric' and 'up' share, declared
// and checked in one place: the initial mode and IP MTU, the TAP's
// offloads, the metrics endpoint and the log level.
type ibFlags struct {
	mode, offloads, metrics *string
	mtu                     *int
	lvl                     *levelFlag
}

// declareIBFlags declares them on fs; dev and tap name the interfaces in
// the usage ("ib0", "each TAP" for the fabric's hosts).
func declareIBFlags(fs *flag.FlagSet, dev, tap string) *ibFlags {
	f := &ibFlags{lvl: &levelFlag{level: slog.LevelInfo}}
	f.mode = fs.String("mode", "connected", "initial mode: connected or datagram")
	f.mtu = fs.Int("mtu", 0, "IP MTU of "+dev+"; 0 = the mode's default (65520 connected, IB MTU - 4 datagram)")
	f.offloads = fs.String("offloads", "on", "on: open "+tap+" with a virtio header so TSO/USO super frames and partial checksums cross it (UD LSO and checksum offload underneath, GRO toward the host); off: one complete frame per read and write")
	f.metrics = fs.String("metrics", "", "serve Prometheus/OpenMetrics metrics at http://ADDR/metrics (e.g. 127.0.0.1:9101; empty: off)")
	fs.Var(f.lvl, "log-level", "log level: "+strings.ReplaceAll(flagcheck.LogLevels, " or", ","))
	return f
}

// rules check the values; ibMTU is the port's IB MTU, which bounds the
// datagram-mode IP MTU.
func (f *ibFlags) rules(ibMTU func() int) []rule {
	return []rule{
		oneOf("mode", *f.mode, "connected", "datagram"),
		func() string { return flagcheck.MTU(*f.mode, *f.mtu, ibMTU()) },
		oneOf("offloads", *f.offloads, "on", "off"),
		listenAddr("metrics", *f.metrics),
	}
}
