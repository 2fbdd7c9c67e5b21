package cli

import (
	"io"
	"os"
)

// inProcOptions configures the in-process benchmark (ipoib bench without
// --iperf).
type inProcOptions struct {
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

// Env is what the commands take from the process they run in: the output
// streams, the effective user (root checks) and where control sockets and
// namespace markers live.
type Env struct {
	Stdout, Stderr io.Writer
	// Euid reports the effective user id (os.Geteuid).
	Euid func() int
	// ControlDir is where control sockets live (control.DefaultDir).
	ControlDir string
	// MarkerDir holds namespace owner markers (tap.DefaultMarkerDir).
	MarkerDir string
	// Hangup delivers SIGHUP: 'ipoib up --config' re-reads its file on
	// it; every other command stops as on SIGINT (the terminal closed).
	Hangup <-chan os.Signal
	// NotifySocket is $NOTIFY_SOCKET: the service manager's readiness
	// socket (internal/sdnotify), empty outside one.
	NotifySocket string
	// Journal says stderr is journald's stream ($JOURNAL_STREAM names
	// it): log lines then carry their priority.
	Journal bool

	// fabricReady, if set, is called once the lab serves its control
	// socket (tests synchronise on it).
	fabricReady func(controlPath string)
	// upReady is handed to runUp as UpOptions.Ready.
	upReady func(controlPath string)
}
