package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Format writes one interface's snapshot as text: a header and packet
// counters laid out like ip -s link, then per-reason drops and the NAPI,
// reaper and CM statistics as name: value lines like ethtool -S, then the
// neighbour and connection tables.
//
// The statistics are read as generic JSON (keys matched ignoring case and
// underscores), so a field the engine adds later is shown rather than
// lost, and a malformed snapshot is an error, never a panic.
func Format(w io.Writer, s InterfaceStats) error {
	sections, original, err := splitSections(s.Stats)
	if err != nil {
		return fmt.Errorf("format %s: %w", s.Interface.Host, err)
	}
	b := &bytes.Buffer{}
	info := s.Interface
	state := "DOWN"
	if info.LinkUp {
		state = "UP"
	}
	fmt.Fprintf(b, "%s: %s: <%s> mode %s mtu %d\n", info.Host, info.Name, state, info.Mode, info.MTU)
	fmt.Fprintf(b, "    link/infiniband %s\n", info.HWAddr)
	for _, a := range info.Addrs {
		fmt.Fprintf(b, "    inet %s\n", a)
	}

	counters, err := flatten(sections["counters"])
	if err != nil {
		return fmt.Errorf("format %s: counters: %w", info.Host, err)
	}
	writeCounterTable(b, "RX", counters, []string{"rx_bytes", "rx_packets", "rx_errors", "rx_dropped", "multicast", "rx_dead_dropped"})
	writeCounterTable(b, "TX", counters, []string{"tx_bytes", "tx_packets", "tx_errors", "tx_dropped"})

	// Top-level scalars the header does not already show.
	other := map[string]json.RawMessage{}
	for k, v := range sections {
		switch k {
		case "counters", "drops", "napi", "reaper", "cm", "neighbours", "txconns", "rxconns",
			"name", "mode", "mtu", "hwaddr", "linkup":
			continue
		}
		other[original[k]] = v
	}
	otherJSON, _ := json.Marshal(other)
	sections["interface"] = otherJSON

	for _, sec := range []struct{ key, title string }{
		{"interface", "interface"}, {"drops", "drops"}, {"napi", "napi"}, {"reaper", "reaper"}, {"cm", "cm"},
	} {
		kv, err := flatten(sections[sec.key])
		if err != nil {
			return fmt.Errorf("format %s: %s: %w", info.Host, sec.key, err)
		}
		if len(kv) == 0 {
			continue
		}
		fmt.Fprintf(b, "    %s:\n", sec.title)
		for _, k := range sortedKeys(kv) {
			fmt.Fprintf(b, "        %s: %s\n", k, kv[k])
		}
	}

	for _, sec := range []struct{ key, title string }{
		{"neighbours", "neighbours"}, {"txconns", "tx connections"}, {"rxconns", "rx connections"},
	} {
		if err := writeObjectTable(b, sec.title, sections[sec.key]); err != nil {
			return fmt.Errorf("format %s: %s: %w", info.Host, sec.key, err)
		}
	}
	_, err = w.Write(b.Bytes())
	return err
}

// normKey folds a JSON key for matching: "TXConns", "tx_conns" and
// "txconns" are the same section; "Neighbors" is accepted for neighbours.
func normKey(k string) string {
	k = strings.ToLower(strings.ReplaceAll(k, "_", ""))
	if k == "neighbors" {
		return "neighbours"
	}
	return k
}

// splitSections indexes the top-level object by normalised key and
// remembers each key's original spelling for display.
func splitSections(raw json.RawMessage) (map[string]json.RawMessage, map[string]string, error) {
	out, original := map[string]json.RawMessage{}, map[string]string{}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return out, original, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, nil, fmt.Errorf("stats: %w", err)
	}
	for k, v := range top {
		out[normKey(k)] = v
		original[normKey(k)] = k
	}
	return out, original, nil
}

// flatten turns a JSON object into dotted-name -> rendered-value pairs.
func flatten(raw json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if len(raw) == 0 {
		return out, nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if v == nil {
		return out, nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want an object, got %s", jsonKind(v))
	}
	flattenInto(out, "", obj)
	return out, nil
}

func flattenInto(out map[string]string, prefix string, obj map[string]any) {
	for k, v := range obj {
		name := strings.ToLower(k)
		if prefix != "" {
			name = prefix + "." + name
		}
		if m, ok := v.(map[string]any); ok {
			flattenInto(out, name, m)
			continue
		}
		out[name] = renderValue(k, v)
	}
}

func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "null"
}

// renderValue prints durations (Go marshals time.Duration as integer
// nanoseconds) in a readable unit for keys that name one.
func renderValue(key string, v any) string {
	switch x := v.(type) {
	case json.Number:
		if isDurationKey(key) {
			if n, err := x.Int64(); err == nil {
				return time.Duration(n).Round(time.Millisecond).String()
			}
		}
		return x.String()
	case string:
		if isDurationKey(key) {
			// Timestamps (time.Time marshals as RFC 3339) shown as a
			// wall-clock time, which is what matters next to an age.
			if ts, err := time.Parse(time.RFC3339Nano, x); err == nil {
				return ts.Format("15:04:05.000")
			}
		}
		if x == "" {
			return "-"
		}
		return x
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return "-"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func isDurationKey(key string) bool {
	k := normKey(key)
	return k == "age" || k == "lastuse" || k == "idle" || strings.HasSuffix(k, "ns") && strings.Contains(k, "time")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// writeCounterTable prints an ip -s link style block: a header row of
// counter names and a row of values, for the names present.
func writeCounterTable(b *bytes.Buffer, dir string, counters map[string]string, names []string) {
	var heads, vals []string
	for _, n := range names {
		v, ok := counters[n]
		if !ok {
			continue
		}
		heads = append(heads, strings.TrimPrefix(strings.TrimPrefix(n, "rx_"), "tx_"))
		vals = append(vals, v)
	}
	if len(heads) == 0 {
		return
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "    %s:\t%s\t\n", dir, strings.Join(heads, "\t"))
	fmt.Fprintf(tw, "    \t%s\t\n", strings.Join(vals, "\t"))
	tw.Flush()
}

// preferredColumns come first in connection and neighbour tables, in this
// order; other keys follow alphabetically.
var preferredColumns = []string{
	"peer", "ip", "ips", "hwaddr", "peergid", "gid", "mac", "connected", "txconn",
	"localqpn", "qpn", "remoteqpn", "state", "mtu", "age", "lastuse", "packets", "bytes",
}

func columnRank(k string) int {
	if i := slices.Index(preferredColumns, normKey(k)); i >= 0 {
		return i
	}
	return len(preferredColumns)
}

func writeObjectTable(b *bytes.Buffer, title string, raw json.RawMessage) error {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		fmt.Fprintf(b, "    %s: none\n", title)
		return nil
	}
	var rows []map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&rows); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintf(b, "    %s: none\n", title)
		return nil
	}
	seen := map[string]bool{}
	var cols []string
	for _, r := range rows {
		for k := range r {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		}
	}
	slices.SortFunc(cols, func(a, c string) int {
		if ra, rc := columnRank(a), columnRank(c); ra != rc {
			return ra - rc
		}
		return strings.Compare(a, c)
	})
	fmt.Fprintf(b, "    %s (%d):\n", title, len(rows))
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	heads := make([]string, len(cols))
	for i, c := range cols {
		heads[i] = strings.ToUpper(c)
	}
	fmt.Fprintf(tw, "        %s\n", strings.Join(heads, "\t"))
	for _, r := range rows {
		vals := make([]string, len(cols))
		for i, c := range cols {
			v, ok := r[c]
			if !ok {
				vals[i] = "-"
				continue
			}
			vals[i] = renderValue(c, v)
		}
		fmt.Fprintf(tw, "        %s\n", strings.Join(vals, "\t"))
	}
	return tw.Flush()
}
