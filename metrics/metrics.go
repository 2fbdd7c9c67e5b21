// Package metrics serves the Prometheus metrics of running interfaces:
// the Linux IPoIB counters, drops by reason, the NAPI, reaper and CM
// statistics as labelled series, a bounded number of per-connection
// series, and histograms of the CM connect time and of the passive
// teardown time (dead flag to destroy).
//
// Counters and gauges are read from the engine's Stats snapshots when
// Prometheus scrapes, so the data path pays nothing for them; the two
// histograms are fed by the engine's EventObserver.
package metrics

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ipoibcm/ipoib/ipoibcm"
)

// MaxConnSeries bounds the per-connection series of one host and
// direction: the busiest connections (by bytes) get their own series,
// the rest are summed under local_qpn="other". A soak with thousands of
// short connections thus exports at most 2*MaxConnSeries+2 of them per
// host, and series of reaped connections vanish at the next scrape.
const MaxConnSeries = 16

const namespace = "ipoib"

// Source is one interface whose Stats are exported under its host name.
type Source struct {
	Host  string
	Stats func() ipoibcm.Stats
	// Device, if set, returns the HCA backend's counters (a struct whose
	// JSON has numbers and objects of numbers, like rocev2.Stats); they
	// are exported as ipoib_<DeviceName>_<field>_total, objects with a
	// "reason" label.
	DeviceName string
	Device     func() any
}

// Metrics is a Prometheus registry over a set of interfaces. The zero
// value is not usable; call New.
type Metrics struct {
	reg      *prometheus.Registry
	connect  *prometheus.HistogramVec
	teardown *prometheus.HistogramVec

	mu      sync.Mutex
	sources []Source
}

// Buckets of the two histograms, in seconds: CM handshakes take tens of
// microseconds on the soft fabric and up to the REQ timeout (seconds)
// across a lossy RoCEv2 path; passive teardown waits for LAST_WQE and a
// drain, milliseconds, or for DrainTimeout when a backend wedges.
var (
	connectBuckets  = prometheus.ExponentialBuckets(25e-6, 4, 11) // 25 µs .. 26 s
	teardownBuckets = prometheus.ExponentialBuckets(25e-6, 4, 11)
)

// New returns an empty registry with the Go runtime and process
// collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.connect = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "cm_connect_seconds",
		Help:    "Time from sending a CM REQ to the connection being established (REP received, RTU sent).",
		Buckets: connectBuckets,
	}, []string{"host"})
	m.teardown = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "passive_teardown_seconds",
		Help:    "Time from setting a passive connection's dead flag to destroying its QP (LAST_WQE, drain, reap).",
		Buckets: teardownBuckets,
	}, []string{"host"})
	m.reg.MustRegister(m.connect, m.teardown, (*statsCollector)(m),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry to serve (promhttp.HandlerFor) or gather.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Add exports one more interface.
func (m *Metrics) Add(s Source) {
	m.mu.Lock()
	m.sources = append(m.sources, s)
	m.mu.Unlock()
}

// Observer is the EventObserver to put in the Config of host's
// interface: it feeds the histograms.
func (m *Metrics) Observer(host string) ipoibcm.EventObserver {
	return &observer{
		connect:  m.connect.WithLabelValues(host),
		teardown: m.teardown.WithLabelValues(host),
	}
}

type observer struct {
	connect, teardown prometheus.Observer
}

func (o *observer) ObserveEvent(e ipoibcm.Event) {
	switch e.Kind {
	case ipoibcm.EventTXEstablished:
		o.connect.Observe(e.Elapsed.Seconds())
	case ipoibcm.EventReaped:
		if e.Elapsed > 0 {
			o.teardown.Observe(e.Elapsed.Seconds())
		}
	}
}

// statsCollector turns Stats snapshots into const metrics at each scrape.
// It describes nothing up front (an unchecked collector): its label sets
// depend on the snapshot.
type statsCollector Metrics

func (c *statsCollector) Describe(chan<- *prometheus.Desc) {}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := slices.Clone(c.sources)
	c.mu.Unlock()
	e := emitter{ch: ch, descs: map[string]*prometheus.Desc{}}
	for _, s := range sources {
		e.host(s.Host, s.Stats())
		if s.Device != nil {
			e.device(s.DeviceName, s.Host, s.Device())
		}
	}
}

// emitter builds const metrics, one Desc per name and label set.
type emitter struct {
	ch    chan<- prometheus.Metric
	descs map[string]*prometheus.Desc
}

func (e *emitter) emit(name, help string, vt prometheus.ValueType, v float64, labels []string, values ...string) {
	d, ok := e.descs[name]
	if !ok {
		d = prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
		e.descs[name] = d
	}
	e.ch <- prometheus.MustNewConstMetric(d, vt, v, values...)
}

var linuxCounters = []struct{ name, help string }{
	{"rx_packets", "Packets received from the fabric and written to the host."},
	{"tx_packets", "Packets sent on the fabric whose send completed."},
	{"rx_bytes", "Bytes of received IPoIB messages (4-byte header included)."},
	{"tx_bytes", "Bytes of sent IPoIB messages (4-byte header included)."},
	{"tx_errors", "Sends that failed: post errors, completions in error, packets too big."},
	{"rx_dropped", "Sum of the rx_* drop reasons (rx_own_echo excepted)."},
	{"tx_dropped", "Sum of the tx_* drop reasons."},
	{"multicast", "Multicast and broadcast packets received."},
	{"rx_dead_dropped", "Receive completions of connections in teardown, recycled and not delivered."},
	{"rx_wrong_pkey", "Packets the port dropped for a P_Key outside its partitions or the receiving QP's (per device)."},
	{"rx_ud_no_buffer", "UD datagrams the port dropped for want of a posted receive: peers sending faster than the UD ring is reposted (per device)."},
}

func (e *emitter) host(host string, s ipoibcm.Stats) {
	h := []string{"host"}
	cv := map[string]uint64{
		"rx_packets": s.Counters.RxPackets, "tx_packets": s.Counters.TxPackets,
		"rx_bytes": s.Counters.RxBytes, "tx_bytes": s.Counters.TxBytes, "tx_errors": s.Counters.TxErrors,
		"rx_dropped": s.Counters.RxDropped, "tx_dropped": s.Counters.TxDropped,
		"multicast": s.Counters.Multicast, "rx_dead_dropped": s.Counters.RxDeadDropped,
		"rx_wrong_pkey": s.Counters.RxWrongPKey, "rx_ud_no_buffer": s.Counters.RxUDNoBuffer,
	}
	for _, c := range linuxCounters {
		e.emit(c.name+"_total", c.help, prometheus.CounterValue, float64(cv[c.name]), h, host)
	}
	up := 0.0
	if s.LinkUp {
		up = 1
	}
	e.emit("link_up", "1 if the interface is up.", prometheus.GaugeValue, up, h, host)
	e.emit("mtu_bytes", "IP MTU of the interface.", prometheus.GaugeValue, float64(s.MTU), h, host)
	e.emit("info", "Mode of the interface (value 1).", prometheus.GaugeValue, 1, []string{"host", "mode", "hwaddr"}, host, s.Mode, s.HWAddr)
	e.emit("tx_outstanding", "Sends posted and not yet completed (TX credits in use).", prometheus.GaugeValue, float64(s.Outstanding), h, host)
	e.emit("srq_posted", "Receive buffers posted on the SRQ.", prometheus.GaugeValue, float64(s.SRQPosted), h, host)
	e.emit("srq_size", "Receive buffers the SRQ owns, posted or in use; it grows under load.", prometheus.GaugeValue, float64(s.SRQSize), h, host)
	e.emit("srq_grown_total", "Times the SRQ limit event doubled the SRQ.", prometheus.CounterValue, float64(s.SRQGrown), h, host)
	e.emit("neighbours", "Entries in the neighbour table.", prometheus.GaugeValue, float64(len(s.Neighbours)), h, host)

	for _, r := range sortedKeys(s.Drops) {
		e.emit("drops_total", "Packets dropped, by reason (docs/counters.md).", prometheus.CounterValue,
			float64(s.Drops[r]), []string{"host", "reason"}, host, r)
	}
	e.structSeries("napi", "NAPI poll context statistics (napi.Stats), per poller.", host, "poller", "rx", s.NAPI.RX)
	e.structSeries("napi", "NAPI poll context statistics (napi.Stats), per poller.", host, "poller", "tx", s.NAPI.TX)
	for k, q := range s.Queues {
		e.structSeries("queue", "Frames and bytes per host queue: tx read from the host, rx written to it (ipoibcm.QueueStats).", host, "queue", strconv.Itoa(k), q)
	}
	e.structSeries("reaper", "Teardown and connection statistics (ipoibcm.ReaperStats).", host, "", "", s.Reaper)
	e.cm(host, s)
	e.conns(host, "tx", s.TXConns)
	e.conns(host, "rx", s.RXConns)
}

// structSeries exports every numeric field of a stats struct as
// <prefix>_<field>_total (max_* fields as gauges), with an optional extra
// label. The JSON names are the ones show --json prints.
func (e *emitter) structSeries(prefix, help, host, label, value string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	var m map[string]json.Number
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return
	}
	labels, values := []string{"host"}, []string{host}
	if label != "" {
		labels, values = append(labels, label), append(values, value)
	}
	for _, k := range sortedKeys(m) {
		f, err := m[k].Float64()
		if err != nil {
			continue
		}
		if len(k) > 4 && k[:4] == "max_" {
			e.emit(prefix+"_"+k, help, prometheus.GaugeValue, f, labels, values...)
			continue
		}
		e.emit(prefix+"_"+k+"_total", help, prometheus.CounterValue, f, labels, values...)
	}
}

// device exports a backend's counters: numbers as counters, objects of
// numbers (drops by reason) as a counter with a reason label.
func (e *emitter) device(prefix, host string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return
	}
	help := "Counters of the HCA backend (" + prefix + "), as ipoib show prints them."
	for _, k := range sortedKeys(m) {
		switch x := m[k].(type) {
		case json.Number:
			if f, err := x.Float64(); err == nil {
				e.emit(prefix+"_"+k+"_total", help, prometheus.CounterValue, f, []string{"host"}, host)
			}
		case map[string]any:
			for _, r := range sortedKeys(x) {
				if n, ok := x[r].(json.Number); ok {
					if f, err := n.Float64(); err == nil {
						e.emit(prefix+"_"+k+"_total", help, prometheus.CounterValue, f, []string{"host", "reason"}, host, r)
					}
				}
			}
		}
	}
}

func (e *emitter) cm(host string, s ipoibcm.Stats) {
	c := s.CM
	for t, n := range c.Sent {
		e.emit("cm_sent_total", "CM MADs sent, by type (retries included).", prometheus.CounterValue, float64(n), []string{"host", "type"}, host, t.String())
	}
	for t, n := range c.Received {
		e.emit("cm_received_total", "Well-formed CM MADs received, by type.", prometheus.CounterValue, float64(n), []string{"host", "type"}, host, t.String())
	}
	for r, n := range c.Dropped {
		e.emit("cm_dropped_total", "CM MADs dropped on receipt, by reason.", prometheus.CounterValue, float64(n), []string{"host", "reason"}, host, r.String())
	}
	for r, n := range c.RejSent {
		e.emit("cm_rej_sent_total", "CM REJs sent, by reason.", prometheus.CounterValue, float64(n), []string{"host", "reason"}, host, r.String())
	}
	for r, n := range c.RejReceived {
		e.emit("cm_rej_received_total", "CM REJs received, by reason.", prometheus.CounterValue, float64(n), []string{"host", "reason"}, host, r.String())
	}
	h := []string{"host"}
	e.emit("cm_retries_total", "CM resends after a response timeout.", prometheus.CounterValue, float64(c.Retries), h, host)
	e.emit("cm_timeouts_total", "CM transactions whose retries ran out.", prometheus.CounterValue, float64(c.Timeouts), h, host)
	e.emit("cm_stale_reqs_total", "REQs rejected with STALE_CONN.", prometheus.CounterValue, float64(c.StaleREQs), h, host)
	e.emit("cm_duplicate_reqs_total", "REQs for a connection already known.", prometheus.CounterValue, float64(c.DuplicateREQs), h, host)
	e.emit("cm_unknown_dreqs_total", "DREQs for no connection.", prometheus.CounterValue, float64(c.UnknownDREQs), h, host)
	e.emit("cm_send_errors_total", "CM MADs that could not be posted or completed in error.", prometheus.CounterValue, float64(c.SendErrors), h, host)
	e.emit("cm_live_conns", "Connections the CM tracks, time-wait included.", prometheus.GaugeValue, float64(c.LiveConns), h, host)
}

// conns exports the connections of one direction: how many per state,
// and packets/bytes of the MaxConnSeries busiest, the rest as "other".
func (e *emitter) conns(host, dir string, cs []ipoibcm.ConnInfo) {
	states := map[string]int{}
	for _, c := range cs {
		states[c.State]++
	}
	for _, st := range sortedKeys(states) {
		e.emit("connections", "RC connections, by direction and state.", prometheus.GaugeValue, float64(states[st]),
			[]string{"host", "dir", "state"}, host, dir, st)
	}
	sorted := slices.Clone(cs)
	sort.SliceStable(sorted, func(a, b int) bool { return sorted[a].Bytes > sorted[b].Bytes })
	labels := []string{"host", "dir", "local_qpn", "remote_qpn"}
	var otherPkts, otherBytes uint64
	var others int
	seen := map[[2]string]bool{}
	for _, c := range sorted {
		l, r := qpnLabel(uint32(c.LocalQPN)), qpnLabel(uint32(c.RemoteQPN))
		// A connection whose QP is not yet made (QPN 0), or a label pair
		// already used, goes to "other" too: a scrape never repeats a series.
		if len(seen) >= MaxConnSeries || c.LocalQPN == 0 || seen[[2]string{l, r}] {
			otherPkts += c.Packets
			otherBytes += c.Bytes
			others++
			continue
		}
		seen[[2]string{l, r}] = true
		e.emit("conn_packets_total", "Packets of one RC connection (busiest MaxConnSeries per host and direction; the rest under local_qpn=\"other\").",
			prometheus.CounterValue, float64(c.Packets), labels, host, dir, l, r)
		e.emit("conn_bytes_total", "Bytes of one RC connection (as conn_packets_total).",
			prometheus.CounterValue, float64(c.Bytes), labels, host, dir, l, r)
	}
	if others > 0 {
		e.emit("conn_packets_total", "", prometheus.CounterValue, float64(otherPkts), labels, host, dir, "other", "other")
		e.emit("conn_bytes_total", "", prometheus.CounterValue, float64(otherBytes), labels, host, dir, "other", "other")
	}
}

func qpnLabel(q uint32) string { return "0x" + strconv.FormatUint(uint64(q), 16) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
