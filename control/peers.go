package control

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// PeerActivityKey is the stats section in which a host that tracks them
// gives each peer's last receive and retransmits (PeerActivity by the
// peer's hardware address). The engine's own stats have no such section:
// its RX idle stamp is refreshed only every stale-scan period, too coarse
// for "is my peer alive?".
const PeerActivityKey = "peer_activity"

// PeerActivity is what a host measured of one peer.
type PeerActivity struct {
	// LastRXMS is the time since bytes from the peer last arrived on a
	// connection, -1 if none arrived yet; the host samples its
	// connections every SampleMS, so it is exact to that.
	LastRXMS int64 `json:"last_rx_ms"`
	SampleMS int64 `json:"sample_ms"`
	// Retransmits are the packets the host sent again to the peer on its
	// connections (the HCA's go-back-N).
	Retransmits uint64 `json:"retransmits"`
}

// Peer is one line of 'ipoib show peers'.
type Peer struct {
	Host, Dev string
	GID       string
	IPs       []string
	HWAddr    string
	// TX and RX are the connection states each way ("up", "live", ...);
	// "-" for none.
	TX, RX           string
	TXBytes, RXBytes uint64
	// Activity is nil when the host does not track it.
	Activity *PeerActivity
}

type peerStats struct {
	Neighbours []struct {
		IPs    []string `json:"ips"`
		HWAddr string   `json:"hwaddr"`
	} `json:"neighbours"`
	TXConns  []peerConn              `json:"tx_conns"`
	RXConns  []peerConn              `json:"rx_conns"`
	Activity map[string]PeerActivity `json:"peer_activity"`
}

type peerConn struct {
	Peer    string `json:"peer"`
	PeerGID string `json:"peer_gid"`
	State   string `json:"state"`
	Bytes   uint64 `json:"bytes"`
}

// Peers lists the peers of one interface's snapshot: every neighbour and
// every connection's far end, by hardware address.
func Peers(s InterfaceStats) ([]Peer, error) {
	var ps peerStats
	if err := json.Unmarshal(s.Stats, &ps); err != nil {
		return nil, fmt.Errorf("peers of %s %s: %w", s.Interface.Host, s.Interface.Name, err)
	}
	by := map[string]*Peer{}
	get := func(hw string) *Peer {
		p, ok := by[hw]
		if !ok {
			p = &Peer{Host: s.Interface.Host, Dev: s.Interface.Name, HWAddr: hw, TX: "-", RX: "-", GID: gidOf(hw)}
			by[hw] = p
		}
		return p
	}
	for _, n := range ps.Neighbours {
		p := get(n.HWAddr)
		p.IPs = append(p.IPs, n.IPs...)
	}
	for _, c := range ps.TXConns {
		p := get(c.Peer)
		p.TX, p.TXBytes, p.GID = c.State, p.TXBytes+c.Bytes, c.PeerGID
	}
	for _, c := range ps.RXConns {
		p := get(c.Peer)
		if p.RX == "-" || c.State == "live" {
			p.RX = c.State
		}
		p.RXBytes += c.Bytes
		p.GID = c.PeerGID
	}
	out := make([]Peer, 0, len(by))
	for hw, p := range by {
		if a, ok := ps.Activity[hw]; ok {
			p.Activity = &a
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.HWAddr, b.HWAddr) })
	return out, nil
}

// gidOf is the GID in an IPoIB hardware address (bytes 4..19), colon
// hex as the engine prints it; "" if hw is not one.
func gidOf(hw string) string {
	parts := strings.Split(hw, ":")
	if len(parts) != 20 {
		return ""
	}
	var b strings.Builder
	for i := 4; i < 20; i += 2 {
		if i > 4 {
			b.WriteByte(':')
		}
		b.WriteString(parts[i] + parts[i+1])
	}
	return b.String()
}

// FormatPeers prints one line per peer of every snapshot, as 'wg show'
// answers "is my peer alive?": its GID and IPs, hardware address,
// connection state each way, last receive, bytes each way, retransmits.
func FormatPeers(w io.Writer, snaps []InterfaceStats) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tDEV\tPEER GID\tIP\tHWADDR\tTX\tRX\tLAST RX\tTX BYTES\tRX BYTES\tRETRANS")
	for _, s := range snaps {
		peers, err := Peers(s)
		if err != nil {
			return err
		}
		for _, p := range peers {
			ips := strings.Join(p.IPs, ",")
			if ips == "" {
				ips = "-"
			}
			last, retrans := "n/a", "n/a"
			if a := p.Activity; a != nil {
				retrans = fmt.Sprint(a.Retransmits)
				last = "never"
				if a.LastRXMS >= 0 {
					last = fmt.Sprintf("%v ago", roundAgo(time.Duration(a.LastRXMS)*time.Millisecond, time.Duration(a.SampleMS)*time.Millisecond))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", p.Host, p.Dev, p.GID, ips, p.HWAddr, p.TX, p.RX, last, p.TXBytes, p.RXBytes, retrans)
		}
	}
	return tw.Flush()
}

// roundAgo rounds d to the sampling period it is exact to ("<1s" when
// data arrived within the last period).
func roundAgo(d, period time.Duration) string {
	if period <= 0 {
		period = time.Second
	}
	if d < period {
		return "<" + period.String()
	}
	return d.Round(period).String()
}

// FormatFlat prints every number of each snapshot as one "name: value"
// line under a "host dev:" heading, like ethtool -S: names are the
// stats' JSON keys joined with dots (counters.rx_packets,
// rocev2.rx_drops.garbage), sorted, so a script can grep one and the
// names stay as stable as the JSON. Lists (neighbours, connections) are
// not counters and are left to 'show' and 'show peers'.
func FormatFlat(w io.Writer, snaps []InterfaceStats) error {
	var b strings.Builder
	for _, s := range snaps {
		var v any
		dec := json.NewDecoder(strings.NewReader(string(s.Stats)))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("stats of %s %s: %w", s.Interface.Host, s.Interface.Name, err)
		}
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("stats of %s %s: not an object", s.Interface.Host, s.Interface.Name)
		}
		// Per-peer values are keyed by hardware address: 'show peers'.
		delete(obj, PeerActivityKey)
		out := map[string]string{}
		flatNumbers(out, "", obj)
		var top map[string]json.RawMessage
		if err := json.Unmarshal(s.Stats, &top); err != nil {
			return fmt.Errorf("stats of %s %s: %w", s.Interface.Host, s.Interface.Name, err)
		}
		qc, err := queueCounters(top["queues"])
		if err != nil {
			return fmt.Errorf("stats of %s %s: %w", s.Interface.Host, s.Interface.Name, err)
		}
		for k, v := range qc {
			out[k] = v
		}
		fmt.Fprintf(&b, "%s %s:\n", s.Interface.Host, s.Interface.Name)
		keys := make([]string, 0, len(out))
		for k := range out {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "     %s: %s\n", k, out[k])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func flatNumbers(out map[string]string, prefix string, obj map[string]any) {
	for k, v := range obj {
		name := strings.ToLower(k)
		if prefix != "" {
			name = prefix + "." + name
		}
		switch x := v.(type) {
		case map[string]any:
			flatNumbers(out, name, x)
		case json.Number:
			out[name] = x.String()
		case bool:
			if x {
				out[name] = "1"
			} else {
				out[name] = "0"
			}
		}
	}
}
