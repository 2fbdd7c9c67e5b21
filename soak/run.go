package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// soakRun is one soak: an HCA backend (soak_backend.go) with cfg.Hosts
// interfaces, each with a soakHost and a traffic generator.
type soakRun struct {
	cfg   Config
	open  func(*Config, soft.Tap) (soakBackend, error)
	hca   soakBackend
	hosts []*soakHost
	ifcs  []*ipoibcm.Interface
	// watches check the dead flag through the verbs (soak_verbs.go).
	watches []*verbsWatch
	flows   *soakFlows
	viol    soakViolations
	observe *soakObserve

	start      time.Time
	goroutines int // baseline before the fabric started
	sockets    int // open sockets before the fabric started (-1: unknown)
	heapStart  uint64
	heapPeak   uint64
	heapLimit  uint64

	lastPrint time.Time
}

// Run runs the stale-connection reaping soak: it returns the
// report, whose Violations field is what decides pass or fail. An error
// means the soak could not run at all.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	return runSoak(ctx, cfg, newSoakBackend)
}

// runSoak is Run on the backend open returns.
func runSoak(ctx context.Context, cfg Config, open func(*Config, soft.Tap) (soakBackend, error)) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &soakRun{cfg: cfg, open: open, flows: newSoakFlows(cfg.Hosts), goroutines: runtime.NumGoroutine(), sockets: openSockets()}
	if s.observe, err = newSoakObserve(&s.cfg); err != nil {
		return nil, err
	}
	s.viol.onFirst = s.observe.violated
	if err := s.setUp(); err != nil {
		s.observe.finish(&s.cfg, &Report{})
		s.closeAll()
		return nil, err
	}
	s.heapStart = heapInuse()
	s.heapPeak = s.heapStart
	s.heapLimit = uint64(float64(s.heapStart)*cfg.HeapGrowth) + cfg.HeapSlack

	s.start = time.Now()
	stop := make(chan struct{})
	var gens sync.WaitGroup
	for k, h := range s.hosts {
		rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(k)+1))
		gens.Add(1)
		go func() {
			defer gens.Done()
			s.generate(h, rng, stop)
		}()
	}
	monCtx, endEarly := context.WithCancel(ctx)
	var until sync.WaitGroup
	if cfg.Until != nil {
		until.Add(1)
		go func() {
			defer until.Done()
			s.watchUntil(monCtx, endEarly)
		}()
	}
	s.monitor(monCtx)
	// The caller's context ending before the duration (under ipoib soak:
	// a signal) cut the traffic short; the end checks still run on what
	// there was, and the report says the run was interrupted.
	var interrupted string
	if ctx.Err() != nil {
		interrupted = context.Cause(ctx).Error()
	}
	endEarly()
	until.Wait()
	close(stop)
	gens.Wait()
	s.observe.sample(time.Since(s.start), s.totals(), s.viol.total(), true)
	// The metrics endpoint serves while traffic runs; its goroutines (and
	// a scraper's kept-alive connections) are gone before the end checks
	// count goroutines.
	if err := s.observe.stopMetrics(); err != nil {
		s.cfg.Logger.Warn("soak metrics", "err", err)
	}
	rep := s.finish()
	rep.Interrupted = interrupted
	if err := s.observe.finish(&s.cfg, rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// watchUntil asks cfg.Until every CheckEvery and calls end at its first
// true; it returns then or when ctx ends.
func (s *soakRun) watchUntil(ctx context.Context, end context.CancelFunc) {
	tick := time.NewTicker(s.cfg.CheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.cfg.Until(s.progressNow()) {
			end()
			return
		}
	}
}

// progressNow is the Progress of this moment.
func (s *soakRun) progressNow() Progress {
	p := Progress{Elapsed: time.Since(s.start), Violations: make(map[string]uint64)}
	for _, ifc := range s.ifcs {
		r := ifc.Stats().Reaper
		addReaper(&p.Engine, &r)
	}
	for _, inv := range s.viol.results() {
		if inv.Violations > 0 {
			p.Violations[inv.Name] = inv.Violations
		}
	}
	return p
}

// setUp creates the fabric and starts every interface.
func (s *soakRun) setUp() error {
	cfg := &s.cfg
	b, err := s.open(cfg, s.observe.tap())
	if err != nil {
		return err
	}
	s.hca = b
	for k := range cfg.Hosts {
		dev, err := s.hca.device(k)
		if err != nil {
			return fmt.Errorf("soak: host %d: %w", k, err)
		}
		h := newSoakHost(k, cfg.HostBatch, cfg.HostQueue, s.flows, &s.viol)
		watch := newVerbsWatch(k, &s.viol, cfg.Mutations)
		h.watch = watch
		ifc, err := ipoibcm.New(ipoibcm.Config{
			Device: watch.wrap(dev), Host: h, Name: fmt.Sprintf("ib%d", k), Mode: ipoibcm.ModeConnected,
			SendQueueSize: cfg.SendQueueSize, RecvQueueSize: cfg.RecvQueueSize,
			// A fixed SRQ, as Linux's: the soak's small one keeps receives
			// short of buffers (RNR) while connections are reaped.
			MaxRecvQueueSize: cfg.RecvQueueSize,
			CM: cm.Options{
				// Packet life time 1 (1 ms) keeps the resend interval near
				// the response timeout, as before the CM derived it.
				ResponseTimeout: cfg.CMResponseTimeout, PacketLifeTime: 1, MaxRetries: 3, TimeWait: cfg.CMTimeWait,
				Seed: cfg.Seed*7919 + int64(k), QueueDepth: 256,
			},
			CMBackoff:   cfg.CMBackoff,
			RCRetry:     s.hca.rcRetry(),
			StaleUpdate: cfg.StaleUpdate, StaleAfter: cfg.StaleAfter, StaleScan: cfg.StaleScan,
			NeighbourTimeout: cfg.NeighbourTimeout, DrainTimeout: cfg.DrainTimeout,
			// The soak's hosts keep ARP entries forever, where Linux lets
			// them go stale and re-probes; with neighbours evicted at the
			// default 10 x NeighbourTimeout (1.5 s here) they would keep
			// sending to a forgotten MAC. Eviction has its own test
			// (TestIdleNeighboursEvicted); the soak is about reaping.
			NeighbourEvictAfter: time.Hour,
			Logger:              cfg.Logger.With("host", k),
			Events:              s.observe.events(fmt.Sprintf("soak%d", k)),
		})
		if err != nil {
			h.Close()
			return fmt.Errorf("soak: host %d: %w", k, err)
		}
		s.hosts = append(s.hosts, h)
		s.watches = append(s.watches, watch)
		s.ifcs = append(s.ifcs, ifc)
		s.observe.addMetrics(fmt.Sprintf("soak%d", k), ifc)
		if err := ifc.Start(); err != nil {
			return fmt.Errorf("soak: host %d: %w", k, err)
		}
	}
	return nil
}

// closeAll closes every interface and then the fabric (setup failed).
func (s *soakRun) closeAll() {
	s.closeIfaces()
	if s.hca != nil {
		s.hca.close()
	}
}

// generate is one host's traffic: pick a peer (often the previous one, so
// bursts race the peer's reaper), resolve it, send a burst, go idle.
func (s *soakRun) generate(h *soakHost, rng *rand.Rand, stop <-chan struct{}) {
	cfg := &s.cfg
	seq := make([]uint64, cfg.Hosts)
	peer := -1
	for {
		if peer < 0 || rng.Float64() >= cfg.RepeatPeer {
			peer = rng.IntN(cfg.Hosts - 1)
			if peer >= h.idx {
				peer++
			}
		}
		mac, ok := s.resolve(h, peer, rng, stop)
		if ok {
			for k := range 1 + rng.IntN(cfg.BurstMax) {
				seq[peer]++
				f := h.dataFrame(mac, peer, seq[peer], s.packetSize(rng))
				if !h.enqueue(queuedFrame{b: f, dst: peer}, false, stop) {
					return
				}
				// Like a host waiting for a handshake, give the first
				// packet time to bring the connection up: the engine
				// parks only three packets per neighbour meanwhile.
				if k == 0 && !wait(cfg.FirstPacketPause, stop) {
					return
				}
			}
		}
		if !wait(s.idleTime(rng), stop) {
			return
		}
	}
}

// idleTime mixes three kinds of pause: short (the connection stays up),
// about the stale timeout (the next burst races the reaper), and long
// (the passive side reaps the connection).
func (s *soakRun) idleTime(rng *rand.Rand) time.Duration {
	after, scan := s.cfg.StaleAfter, s.cfg.StaleScan
	switch x := rng.Float64(); {
	case x < 0.4:
		return randDur(rng, 0, after/4)
	case x < 0.7:
		return randDur(rng, after/2, after+2*scan)
	default:
		return randDur(rng, after+2*scan, 2*(after+2*scan))
	}
}

// packetSize is an IP packet size: mostly Ethernet-sized, sometimes up to
// the connected-mode MTU.
func (s *soakRun) packetSize(rng *rand.Rand) int {
	if rng.Float64() < 0.8 || s.cfg.MaxPacket <= 1500 {
		return soakMinIP + rng.IntN(min(1500, s.cfg.MaxPacket)-soakMinIP+1)
	}
	return 1500 + rng.IntN(s.cfg.MaxPacket-1500+1)
}

func randDur(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// wait pauses the generator (traffic pacing, not synchronisation); false
// when stop closed.
func wait(d time.Duration, stop <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// resolve returns the MAC the engine mapped peer to, asking with ARP when
// the host does not know it. Now and then a known peer is asked again:
// the reply must name the same MAC (checked in receiveARP). Replies can be
// lost (UD loss), so a request is retried a few times.
func (s *soakRun) resolve(h *soakHost, peer int, rng *rand.Rand, stop <-chan struct{}) (mac [6]byte, ok bool) {
	ip := soakHostIP(peer)
	if known, had := h.lookupARP(ip); had {
		if rng.Float64() < s.cfg.ReARP {
			h.enqueue(queuedFrame{b: h.arpRequest(ip), dst: -1}, false, stop)
		}
		return known, true
	}
	for range 4 {
		select {
		case <-h.arpReply: // a signal left by an earlier reply
		default:
		}
		if !h.enqueue(queuedFrame{b: h.arpRequest(ip), dst: -1}, false, stop) {
			return mac, false
		}
		t := time.NewTimer(s.cfg.ARPTimeout)
	waitReply:
		for {
			select {
			case <-h.arpReply:
				if m, ok := h.lookupARP(ip); ok {
					t.Stop()
					return m, true
				}
			case <-t.C:
				break waitReply
			case <-stop:
				t.Stop()
				return mac, false
			}
		}
	}
	return mac, false
}

func heapInuse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
