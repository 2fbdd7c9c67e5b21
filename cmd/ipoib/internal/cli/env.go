package cli

import (
	"context"
	"io"
	"log/slog"
	"net/netip"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/tap"
)

// Engine is what the CLI needs from the IPoIB engine.
type Engine interface {
	// NewFabric creates an in-process soft fabric.
	NewFabric(seed int64, logger *slog.Logger) (Fabric, error)
}

// Fabric is one soft fabric of hosts.
type Fabric interface {
	// AddHost creates a device on the fabric and an IPoIB interface named
	// ifname on it with dev as its host port, and starts it. The host owns
	// dev from then on: Host.Close closes it.
	AddHost(host, ifname string, dev *tap.Device, addrs []netip.Prefix, mode string, mtu int) (Host, error)
	Close() error
}

// Host is one running interface.
type Host interface {
	control.Endpoint
	Close() error
}

// InProcOptions configures the in-process benchmark (ipoib bench without
// --iperf).
type InProcOptions struct {
	Bytes int64
	// MTU is the IP MTU of the direct and ib0 connected rows; DatagramMTU
	// that of the direct and ib0 datagram rows.
	MTU, DatagramMTU int
	// Runs per row; the report shows the median.
	Runs int
	JSON bool
	// Plot, if set, is an SVG file for the report's chart.
	Plot string
	// Progress receives a line per transfer (the CLI's stderr).
	Progress io.Writer
}

// Env is everything the commands touch outside themselves, so tests can
// substitute each piece.
type Env struct {
	Stdout, Stderr io.Writer
	// Euid reports the effective user id (os.Geteuid).
	Euid func() int
	// ControlDir is where control sockets live (control.DefaultDir).
	ControlDir string
	// MarkerDir holds namespace owner markers (tap.DefaultMarkerDir).
	MarkerDir string
	// Engine runs ib0; nil makes fabric and the ib0 bench runs fail with a
	// message.
	Engine Engine
	// InProc runs the in-process benchmark (bench.InProcTCP); nil: not
	// built in.
	InProc func(ctx context.Context, opts InProcOptions, out io.Writer) error
	// Soak runs the soak (bench.Soak) with its own flags and returns the
	// exit status; nil: not built in.
	Soak func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	// Up runs 'ipoib up' (cmd/ipoib/up.go) until ctx ends; nil: not built
	// in. Errors wrapping ErrSetup exit with status 2.
	Up func(ctx context.Context, opts UpOptions, logger *slog.Logger) error
	// Metrics serves the metrics of the fabric's hosts on addr until the
	// returned Closer is closed; nil: not built in.
	Metrics func(addr string, logger *slog.Logger) (io.Closer, error)

	// fabricReady, if set, is called once the lab serves its control
	// socket (tests synchronise on it).
	fabricReady func(controlPath string)
	// upReady is handed to Env.Up as UpOptions.Ready.
	upReady func(controlPath string)
}
