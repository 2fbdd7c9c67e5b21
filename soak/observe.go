package soak

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/capture"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/metrics"
)

// Defaults of the soak's capture ring (--capture): enough for a few
// seconds of a small soak whole, and bounded well inside the heap
// invariant's slack.
const (
	DefaultCapturePackets = 50000
	soakCaptureBytes      = 32 << 20
)

// soakObserve is what watches a soak from outside the engine: the capture
// ring (written when an invariant breaks), the metrics endpoint and the
// timeline for --plot.
type soakObserve struct {
	ring    *capture.Ring
	mux     capture.Mux
	metrics *metrics.Metrics
	server  *metrics.Server

	mu         sync.Mutex
	timeline   []Sample
	lastSample time.Time
	every      time.Duration
}

func newSoakObserve(cfg *Config) (*soakObserve, error) {
	o := &soakObserve{every: sampleEvery(cfg)}
	if cfg.Capture != "" {
		n := cfg.CapturePackets
		if n <= 0 {
			n = DefaultCapturePackets
		}
		o.ring = capture.NewRing(capture.Filter{}, n, soakCaptureBytes)
		o.mux.Attach(o.ring)
	}
	if cfg.Metrics != "" {
		o.metrics = metrics.New()
		srv, err := metrics.Serve(cfg.Metrics, o.metrics, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		o.server = srv
	}
	return o, nil
}

// sampleEvery is the timeline's period: a second, or finer for a short
// soak so its plot has some fifty points.
func sampleEvery(cfg *Config) time.Duration {
	return min(time.Second, max(cfg.CheckEvery, cfg.Duration/50))
}

// tap is the fabric's soft.Tap, nil when nothing captures (so the fabric
// skips the tap entirely).
func (o *soakObserve) tap() soft.Tap {
	if o.ring == nil {
		return nil
	}
	return &o.mux
}

// events is host's EventObserver: the capture's and the metrics'.
func (o *soakObserve) events(host string) ipoibcm.EventObserver {
	var obs []ipoibcm.EventObserver
	if o.ring != nil {
		obs = append(obs, o.mux.Observer(host))
	}
	if o.metrics != nil {
		obs = append(obs, o.metrics.Observer(host))
	}
	return ipoibcm.Observers(obs...)
}

// addMetrics exports an interface.
func (o *soakObserve) addMetrics(host string, ifc *ipoibcm.Interface) {
	if o.metrics != nil {
		o.metrics.Add(metrics.Source{Host: host, Stats: ifc.Stats})
	}
}

// violated marks the capture at the first break of each invariant.
func (o *soakObserve) violated(name, detail string) {
	if o.ring != nil {
		o.ring.Trigger(fmt.Sprintf("VIOLATION %s: %s", name, detail))
	}
}

// sample adds a timeline point if the period has passed (monitor).
func (o *soakObserve) sample(elapsed time.Duration, t soakTotals, violations uint64, force bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	// A forced sample (the end of traffic) right after a periodic one
	// would make a rate out of a sliver of time.
	if since := now.Sub(o.lastSample); since < o.every && !(force && since > o.every/2) {
		return
	}
	o.lastSample = now
	o.timeline = append(o.timeline, Sample{ElapsedSec: elapsed.Seconds(), Live: t.LiveConns,
		Established: t.Established, Reaped: t.Reaped, DeadDropped: t.DeadDropped, Violations: violations})
}

// stopMetrics closes the metrics endpoint, if there is one; idempotent.
func (o *soakObserve) stopMetrics() error {
	if o.server == nil {
		return nil
	}
	err := o.server.Close()
	o.server = nil
	return err
}

// finish fills the report's timeline, writes the capture if an invariant
// broke, and stops the metrics endpoint if still running.
func (o *soakObserve) finish(cfg *Config, rep *Report) error {
	o.mu.Lock()
	rep.Timeline = append([]Sample(nil), o.timeline...)
	o.mu.Unlock()
	err := o.stopMetrics()
	if o.ring == nil || !rep.Failed() {
		return err
	}
	f, cerr := os.Create(cfg.Capture)
	if cerr != nil {
		return fmt.Errorf("soak: capture: %w", cerr)
	}
	n, werr := o.ring.WriteTo(f)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("soak: capture %s: %w", cfg.Capture, werr)
	}
	rep.CaptureFile, rep.CaptureBytes = cfg.Capture, n
	return err
}
