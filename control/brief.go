package control

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"
)

// summary is the part of a snapshot the one-line views read. encoding/json
// matches the keys ignoring case, as Format does.
type summary struct {
	Counters struct {
		RxPackets uint64 `json:"rx_packets"`
		TxPackets uint64 `json:"tx_packets"`
		RxBytes   uint64 `json:"rx_bytes"`
		TxBytes   uint64 `json:"tx_bytes"`
		TxErrors  uint64 `json:"tx_errors"`
		RxDropped uint64 `json:"rx_dropped"`
		TxDropped uint64 `json:"tx_dropped"`
	} `json:"counters"`
	TXConns     []json.RawMessage `json:"tx_conns"`
	RXConns     []json.RawMessage `json:"rx_conns"`
	McastGroups []struct {
		State string `json:"state"`
	} `json:"mcast_groups"`
}

func summarise(s InterfaceStats) (summary, error) {
	var sum summary
	if len(s.Stats) == 0 {
		return sum, nil
	}
	if err := json.Unmarshal(s.Stats, &sum); err != nil {
		return summary{}, fmt.Errorf("format %s: %w", s.Interface.Host, err)
	}
	return sum, nil
}

func (s summary) drops() uint64 { return s.Counters.RxDropped + s.Counters.TxDropped }

func (s summary) conns() string { return fmt.Sprintf("%d/%d", len(s.TXConns), len(s.RXConns)) }

// mcast counts the multicast groups as full (default ones included) and
// send-only.
func (s summary) mcast() string {
	sendOnly := 0
	for _, g := range s.McastGroups {
		if g.State == "send-only" {
			sendOnly++
		}
	}
	return fmt.Sprintf("%d/%d", len(s.McastGroups)-sendOnly, sendOnly)
}

// SortInterfaces orders snapshots by host name (numeric suffixes
// naturally: h2 before h10), then by interface name, so the output of
// several processes reads as one list.
func SortInterfaces(all []InterfaceStats) {
	slices.SortStableFunc(all, func(a, b InterfaceStats) int {
		if c := CompareHosts(a.Interface.Host, b.Interface.Host); c != 0 {
			return c
		}
		return CompareHosts(a.Interface.Name, b.Interface.Name)
	})
}

// FormatBrief writes one header line and one line per interface, like ip
// -br link: P_Key and membership, mode, MTU, state, packets, drops
// (rx_dropped + tx_dropped), connections (TX/RX) and multicast groups
// (full, the default ones included / send-only).
func FormatBrief(w io.Writer, all []InterfaceStats) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tIFACE\tPKEY\tMEMBER\tMODE\tMTU\tSTATE\tRX-PACKETS\tTX-PACKETS\tDROPS\tCONNS(TX/RX)\tMCAST(FULL/SO)")
	for _, s := range all {
		sum, err := summarise(s)
		if err != nil {
			return err
		}
		i := s.Interface
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\n", i.Host, i.Name, orDash(i.PKey), orDash(i.Membership), i.Mode, i.MTU, linkState(i),
			sum.Counters.RxPackets, sum.Counters.TxPackets, sum.drops(), sum.conns(), sum.mcast())
	}
	return tw.Flush()
}

// Sample is one round of snapshots and the moment they were taken, the
// unit ipoib show --watch differentiates.
type Sample struct {
	At    time.Time
	Stats []InterfaceStats
}

// FormatRates writes one line per interface of cur with per-second rates
// since prev: packets, bits and drops. An interface absent from prev (a
// process started in between) or whose counters went backwards (one
// restarted) has no rate yet and shows "-".
func FormatRates(w io.Writer, prev, cur Sample) error {
	dt := cur.At.Sub(prev.At).Seconds()
	before := map[[2]string]summary{}
	for _, s := range prev.Stats {
		sum, err := summarise(s)
		if err != nil {
			return err
		}
		before[[2]string{s.Interface.Host, s.Interface.Name}] = sum
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "HOST\tIFACE\tSTATE\tRX-PKT/S\tTX-PKT/S\tRX-MBIT/S\tTX-MBIT/S\tDROPS/S\tCONNS(TX/RX)\t\n")
	for _, s := range cur.Stats {
		sum, err := summarise(s)
		if err != nil {
			return err
		}
		i := s.Interface
		old, ok := before[[2]string{i.Host, i.Name}]
		rate := func(now, then uint64, scale float64) string {
			if !ok || now < then || dt <= 0 {
				return "-"
			}
			return strconv.FormatFloat(float64(now-then)*scale/dt, 'f', 1, 64)
		}
		c, o := sum.Counters, old.Counters
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", i.Host, i.Name, linkState(i),
			rate(c.RxPackets, o.RxPackets, 1), rate(c.TxPackets, o.TxPackets, 1),
			rate(c.RxBytes, o.RxBytes, 8e-6), rate(c.TxBytes, o.TxBytes, 8e-6),
			rate(sum.drops(), old.drops(), 1), sum.conns())
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
