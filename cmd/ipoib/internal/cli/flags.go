package cli

import (
	"flag"
	"log/slog"
	"strconv"
	"strings"

	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// fabricIBMTU is the soft fabric's port MTU, which bounds datagram mode's
// IP MTU on the fabric (internal/flagcheck.MTU).
const fabricIBMTU = 4096

// ibFlags are the flags of an ib0 that 'fabric' and 'up' share, declared
// and checked in one place: the initial mode and IP MTU, the TAP's
// offloads and queues, the metrics endpoint and the log level.
type ibFlags struct {
	mode, offloads, metrics *string
	mtu, queues             *int
	lvl                     *levelFlag
}

// maxQueues bounds --queues: each queue costs a host reader goroutine,
// a batch of TX buffers and a TAP fd.
const maxQueues = 16

// defaultQueues is --queues' default (docs/performance.md, "Multi-queue
// ib0", has the measurement behind it).
const defaultQueues = 1

// declareIBFlags declares them on fs; dev and tap name the interfaces in
// the usage ("ib0", "each TAP" for the fabric's hosts).
func declareIBFlags(fs *flag.FlagSet, dev, tap string) *ibFlags {
	f := &ibFlags{lvl: &levelFlag{level: slog.LevelInfo}}
	f.mode = fs.String("mode", "connected", "initial mode: connected or datagram")
	f.mtu = fs.Int("mtu", 0, "IP MTU of "+dev+"; 0 = the mode's default (65520 connected, IB MTU - 4 datagram)")
	f.offloads = fs.String("offloads", "on", "on: open "+tap+" with a virtio header so TSO/USO super frames and partial checksums cross it (UD LSO and checksum offload underneath, GRO toward the host); off: one complete frame per read and write")
	f.queues = fs.Int("queues", defaultQueues, "queues of "+tap+" (IFF_MULTI_QUEUE, 1.."+strconv.Itoa(maxQueues)+"): one host reader and writer each, flows hashed to queues by IP addresses and TCP/UDP ports; above 1 needs --offloads on")
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
		func() string { return checkQueues(*f.queues, *f.offloads) },
		listenAddr("metrics", *f.metrics),
	}
}

// checkQueues checks --queues against its range and --offloads.
func checkQueues(queues int, offloads string) string {
	if msg := flagcheck.IntRange("queues", queues, 1, maxQueues); msg != "" {
		return msg
	}
	if queues > 1 && offloads == "off" {
		return "--queues " + strconv.Itoa(queues) + " needs --offloads on (a multi-queue TAP is opened with the virtio header)"
	}
	return ""
}
