package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// Link names of the in-process suite's rows.
const (
	LinkDirect      = "direct"
	LinkIBConnected = "ib0-connected"
	LinkIBDatagram  = "ib0-datagram"
	// LinkDirectGSO is the direct link with host GSO on: the hosts' TCP
	// super frames cross whole with their offload metadata
	// (DirectLinkOffloads), as veth carries GSO packets whatever the MTU.
	// It is the baseline of the datagram row (docs/performance.md).
	LinkDirectGSO = "direct-gso"
)

// Default MTUs of the suite: the connected-mode maximum, and the UD MTU of
// the soft fabric's 4096-byte IB MTU less the 4-byte IPoIB header.
const (
	DefaultConnectedMTU = 65520
	DefaultDatagramMTU  = 4096 - 4
)

// InProcSuiteConfig configures RunInProcSuite.
type InProcSuiteConfig struct {
	// Bytes per transfer (required).
	Bytes int64
	// Runs per row (default 1); each row reports the median. The rows are
	// interleaved run by run, so a burst of load on a shared machine
	// lands on every row alike rather than on one.
	Runs int
	// ConnectedMTU and DatagramMTU default to DefaultConnectedMTU and
	// DefaultDatagramMTU.
	ConnectedMTU, DatagramMTU int
	// Host is the template of every host in every row (InProcHostConfig
	// when zero), so the ratios compare links, not host settings.
	Host *netstack.Config
	// Seed seeds the soft fabrics.
	Seed int64
	// Progress, if set, receives one line per transfer.
	Progress io.Writer
}

// InProcRow is one link at one MTU: every run and their median.
type InProcRow struct {
	Link string `json:"link"`
	MTU  int    `json:"mtu"`
	// Offloads: super frames crossed the link whole in some run (the
	// hosts' counters, Result.TxSuperFrames/RxSuperFrames): the direct
	// link with host GSO always, ib0 when the engine takes or gives them.
	Offloads   bool     `json:"offloads"`
	Runs       []Result `json:"runs"`
	MedianGbps float64  `json:"median_gbps"`
}

// InProcReport is the outcome of RunInProcSuite. The ratios are of
// medians; 0 means a side is missing.
type InProcReport struct {
	Bytes int64 `json:"bytes"`
	Runs  int   `json:"runs"`
	// GSO and TrustRXChecksums are the host settings every row used.
	GSO              bool        `json:"gso"`
	TrustRXChecksums bool        `json:"trust_rx_checksums"`
	Rows             []InProcRow `json:"rows"`
	// ConnectedVsDirect is ib0 connected over the direct link at the
	// connected MTU.
	ConnectedVsDirect float64 `json:"connected_vs_direct"`
	// ConnectedVsDatagram is ib0 connected over ib0 datagram, each at its
	// own mode's MTU.
	ConnectedVsDatagram float64 `json:"connected_vs_datagram"`
	// DatagramVsDirect is ib0 datagram over the direct link at the
	// datagram MTU: what the engine costs when per-packet work dominates.
	DatagramVsDirect float64 `json:"datagram_vs_direct"`
	// ConnectedVsDirectGSO and DatagramVsDirectGSO set ib0 against the
	// direct link with host GSO on at the same MTU: the upper bound of a
	// host port that moves super frames.
	ConnectedVsDirectGSO float64 `json:"connected_vs_direct_gso"`
	DatagramVsDirectGSO  float64 `json:"datagram_vs_direct_gso"`
}

// inprocCase is one row to measure.
type inprocCase struct {
	link string
	mtu  int
	make func() LinkFactory
}

// RunInProcSuite measures TCP between two in-process hosts over the direct
// link and over ib0 in both modes: direct, ib0 connected and direct with
// host GSO at the connected MTU, the same with ib0 datagram at the
// datagram MTU.
func RunInProcSuite(ctx context.Context, cfg InProcSuiteConfig) (*InProcReport, error) {
	if cfg.Bytes <= 0 {
		return nil, fmt.Errorf("inproc suite: byte count %d must be positive", cfg.Bytes)
	}
	if cfg.Runs <= 0 {
		cfg.Runs = 1
	}
	if cfg.ConnectedMTU == 0 {
		cfg.ConnectedMTU = DefaultConnectedMTU
	}
	if cfg.DatagramMTU == 0 {
		cfg.DatagramMTU = DefaultDatagramMTU
	}
	host := InProcHostConfig()
	if cfg.Host != nil {
		host = *cfg.Host
	}
	ib := func(mode ipoibcm.Mode) func() LinkFactory {
		return func() LinkFactory {
			return IBLink(IBLinkConfig{Mode: mode, Seed: cfg.Seed, ReceiveOrder: soft.ReceiveNewestFirst})
		}
	}
	direct := func() LinkFactory { return DirectLink }
	directGSO := func() LinkFactory { return DirectLinkOffloads }
	cases := []inprocCase{
		{LinkDirect, cfg.ConnectedMTU, direct},
		{LinkIBConnected, cfg.ConnectedMTU, ib(ipoibcm.ModeConnected)},
		{LinkDirectGSO, cfg.ConnectedMTU, directGSO},
		{LinkDirect, cfg.DatagramMTU, direct},
		{LinkIBDatagram, cfg.DatagramMTU, ib(ipoibcm.ModeDatagram)},
		{LinkDirectGSO, cfg.DatagramMTU, directGSO},
	}
	rep := &InProcReport{Bytes: cfg.Bytes, Runs: cfg.Runs, GSO: host.GSO, TrustRXChecksums: host.TrustRXChecksums}
	for _, c := range cases {
		rep.Rows = append(rep.Rows, InProcRow{Link: c.link, MTU: c.mtu})
	}
	for run := range cfg.Runs {
		for k, c := range cases {
			res, err := RunInProcTCP(ctx, InProcConfig{Bytes: cfg.Bytes, MTU: c.mtu, Link: c.make(), Host: host})
			if err != nil {
				return nil, fmt.Errorf("inproc suite: %s mtu %d run %d: %w", c.link, c.mtu, run+1, err)
			}
			rep.Rows[k].Runs = append(rep.Rows[k].Runs, res)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "run %d/%d  %-14s mtu %5d  %s\n", run+1, cfg.Runs, c.link, c.mtu, res)
			}
		}
	}
	rep.summarise()
	return rep, nil
}

// summarise fills the medians and the ratios.
func (r *InProcReport) summarise() {
	for k := range r.Rows {
		row := &r.Rows[k]
		row.MedianGbps = medianGbps(row.Runs)
		for _, res := range row.Runs {
			row.Offloads = row.Offloads || res.TxSuperFrames+res.RxSuperFrames > 0
		}
	}
	directCM, connected := r.median(LinkDirect, LinkIBConnected)
	directUD, datagram := r.median(LinkDirect, LinkIBDatagram)
	r.ConnectedVsDirect = ratio(connected, directCM)
	r.ConnectedVsDatagram = ratio(connected, datagram)
	r.DatagramVsDirect = ratio(datagram, directUD)
	gsoCM, _ := r.median(LinkDirectGSO, LinkIBConnected)
	gsoUD, _ := r.median(LinkDirectGSO, LinkIBDatagram)
	r.ConnectedVsDirectGSO = ratio(connected, gsoCM)
	r.DatagramVsDirectGSO = ratio(datagram, gsoUD)
}

// median returns the median of the direct row at ib's MTU and of the ib
// row itself.
func (r *InProcReport) median(direct, ib string) (float64, float64) {
	var mtu int
	var ibGbps float64
	for _, row := range r.Rows {
		if row.Link == ib {
			mtu, ibGbps = row.MTU, row.MedianGbps
		}
	}
	for _, row := range r.Rows {
		if row.Link == direct && row.MTU == mtu {
			return row.MedianGbps, ibGbps
		}
	}
	return 0, ibGbps
}

// medianGbps is the median throughput of runs: the middle one, or the
// mean of the middle two.
func medianGbps(runs []Result) float64 {
	if len(runs) == 0 {
		return 0
	}
	g := make([]float64, len(runs))
	for k, r := range runs {
		g[k] = r.Gbps
	}
	slices.Sort(g)
	mid := len(g) / 2
	if len(g)%2 == 1 {
		return g[mid]
	}
	return (g[mid-1] + g[mid]) / 2
}

func ratio(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return a / b
}

// WriteTable prints one line per row (median and every run) and the
// ratios.
func (r *InProcReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "in-process TCP, %d bytes per run, median of %d; hosts: gso=%t trust_rx_checksums=%t\n",
		r.Bytes, r.Runs, r.GSO, r.TrustRXChecksums)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "link\tmtu\toffloads\tGbit/s\truns\t\n")
	for _, row := range r.Rows {
		runs := make([]byte, 0, 8*len(row.Runs))
		for k, res := range row.Runs {
			if k > 0 {
				runs = append(runs, ' ')
			}
			runs = fmt.Appendf(runs, "%.2f", res.Gbps)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f\t%s\t\n", row.Link, row.MTU, yesNo(row.Offloads), row.MedianGbps, runs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "connected/direct   %s\nconnected/datagram %s\ndatagram/direct    %s\nconnected/direct-gso %s\ndatagram/direct-gso  %s\n",
		fmtRatio(r.ConnectedVsDirect), fmtRatio(r.ConnectedVsDatagram), fmtRatio(r.DatagramVsDirect),
		fmtRatio(r.ConnectedVsDirectGSO), fmtRatio(r.DatagramVsDirectGSO))
	return err
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteJSON writes the report as indented JSON.
func (r *InProcReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("inproc report: %w", err)
	}
	return nil
}
