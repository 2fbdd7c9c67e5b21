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

// FormatOptions choose what Format prints.
type FormatOptions struct {
	// ShowZero prints counters that are zero too (ipoib show -s). By
	// default they are left out: on a healthy interface most of the
	// hundred-odd counters are zero, and the ones that moved are what a
	// reader looks for. The RX/TX blocks and the tables are always whole.
	ShowZero bool
}

// Format writes one interface's snapshot as text with the default options.
func Format(w io.Writer, s InterfaceStats) error { return FormatOptions{}.Format(w, s) }

// Format writes one interface's snapshot as text: a header and packet
// counters laid out like ip -s link, then per-reason drops and the NAPI,
// reaper and CM statistics as name: value lines like ethtool -S, then the
// neighbour and connection tables.
//
// The statistics are read as generic JSON (keys matched ignoring case and
// underscores), so a field the engine adds later is shown rather than
// lost, and a malformed snapshot is an error, never a panic.
func (o FormatOptions) Format(w io.Writer, s InterfaceStats) error {
	sections, original, err := splitSections(s.Stats)
	if err != nil {
		return fmt.Errorf("format %s: %w", s.Interface.Host, err)
	}
	b := &bytes.Buffer{}
	info := s.Interface
	fmt.Fprintf(b, "%s: %s: <%s> mode %s mtu %d\n", info.Host, info.Name, linkState(info), info.Mode, info.MTU)
	fmt.Fprintf(b, "    link/infiniband %s\n", info.HWAddr)
	if info.PKey != "" || info.Parent != "" {
		fmt.Fprintf(b, "    %s\n", partitionLine(info))
	}
	for _, a := range info.Addrs {
		fmt.Fprintf(b, "    inet %s\n", a)
	}
	for _, n := range info.Notes {
		fmt.Fprintf(b, "    note: %s\n", n)
	}

	counters, err := flatten(sections["counters"])
	if err != nil {
		return fmt.Errorf("format %s: counters: %w", info.Host, err)
	}
	writeCounterTable(b, "RX", counters, []string{"rx_bytes", "rx_packets", "rx_errors", "rx_dropped", "multicast", "rx_dead_dropped", "rx_wrong_pkey", "rx_ud_no_buffer"})
	writeCounterTable(b, "TX", counters, []string{"tx_bytes", "tx_packets", "tx_errors", "tx_dropped"})

	// Top-level scalars the header does not already show.
	other := map[string]json.RawMessage{}
	for k, v := range sections {
		switch k {
		case "counters", "drops", "napi", "reaper", "cm", "neighbours", "txconns", "rxconns", "mcastgroups", "queues",
			"name", "mode", "mtu", "hwaddr", "linkup":
			continue
		}
		other[original[k]] = v
	}
	otherJSON, _ := json.Marshal(other)
	sections["interface"] = otherJSON

	for _, sec := range []struct{ key, title string }{
		{"interface", "interface"}, {"queues", "queues"}, {"drops", "drops"}, {"napi", "napi"}, {"reaper", "reaper"}, {"cm", "cm"},
	} {
		flat := flatten
		if sec.key == "queues" {
			flat = queueCounters
		}
		kv, err := flat(sections[sec.key])
		if err != nil {
			return fmt.Errorf("format %s: %s: %w", info.Host, sec.key, err)
		}
		if !o.ShowZero {
			for k, v := range kv {
				if v == "0" || v == "0s" || v == "false" {
					delete(kv, k)
				}
			}
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
		{"mcastgroups", "multicast groups"},
	} {
		if err := writeObjectTable(b, sec.title, sections[sec.key]); err != nil {
			return fmt.Errorf("format %s: %s: %w", info.Host, sec.key, err)
		}
	}
	_, err = w.Write(b.Bytes())
	return err
}

// linkState is the flag ip link prints between angle brackets.
func linkState(info InterfaceInfo) string {
	if info.LinkUp {
		return "UP"
	}
	return "DOWN"
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

// renderValue prints a value for a reader: durations (keys ending in _ms
// hold integer milliseconds; Go marshals a bare time.Duration as integer
// nanoseconds) in a readable unit, lists of addresses as plain
// comma-separated text.
func renderValue(key string, v any) string {
	switch x := v.(type) {
	case json.Number:
		if unit, ok := durationUnit(key); ok {
			if n, err := x.Int64(); err == nil {
				return (time.Duration(n) * unit).Round(time.Millisecond).String()
			}
		}
		return x.String()
	case string:
		if x == "" {
			return "-"
		}
		return x
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return "-"
	case []any:
		if len(x) == 0 {
			return "-"
		}
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = renderValue("", e)
		}
		return strings.Join(parts, ",")
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// durationUnit says whether a key names a duration and in what unit its
// integer value is.
func durationUnit(key string) (time.Duration, bool) {
	k := strings.ToLower(key)
	if strings.HasSuffix(k, "_ms") {
		return time.Millisecond, true
	}
	n := normKey(key)
	if n == "age" || n == "idle" || strings.HasSuffix(n, "ns") && strings.Contains(n, "time") {
		return time.Nanosecond, true
	}
	return 0, false
}

// columnTitle is a table heading: the key without its unit suffix.
func columnTitle(key string) string {
	k := key
	if strings.HasSuffix(strings.ToLower(k), "_ms") {
		k = k[:len(k)-3]
	}
	return strings.ToUpper(k)
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
	"peer", "ip", "ips", "mgid", "groups", "mac", "hwaddr", "peergid", "gid", "connected", "txconn",
	"localqpn", "qpn", "remoteqpn", "state", "mtu", "age", "agems", "idle", "idlems", "lastuse", "packets", "bytes",
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
		heads[i] = columnTitle(c)
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

// partitionLine is the P_Key line of the text view, in the words of
// ip -d link's "ipoib pkey 0x8001 mode connected" and Linux's sysfs
// parent file: "pkey 0x8001 membership full parent ib0".
func partitionLine(info InterfaceInfo) string {
	var parts []string
	if info.PKey != "" {
		parts = append(parts, "pkey "+info.PKey)
	}
	if info.Membership != "" {
		parts = append(parts, "membership "+info.Membership)
	}
	if info.Parent != "" {
		parts = append(parts, "parent "+info.Parent)
	}
	return strings.Join(parts, " ")
}
