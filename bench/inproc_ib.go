package bench

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// IBLinkConfig describes the ib0 link IBLink builds between two in-process
// hosts.
type IBLinkConfig struct {
	// Mode is the IPoIB mode of both interfaces.
	Mode ipoibcm.Mode
	// MTU is the interfaces' IP MTU; 0 takes host A's MTU. The engine caps
	// it at what the mode carries (the UD MTU in datagram mode) and tells
	// both hosts, so a datagram link lowers a larger host MTU.
	MTU int
	// Seed seeds the soft fabric.
	Seed int64
	// ReceiveOrder is the soft fabric's choice of receive buffer. The
	// suite and the benchmarks use soft.ReceiveNewestFirst, as 'ipoib
	// fabric' does: the fabric's copy stands in for an HCA's DMA, which
	// costs the CPU no cache, and cycling oldest-first through a 256 x
	// 64 KiB SRQ makes every copy miss it.
	ReceiveOrder soft.ReceiveOrder
	// Logger receives the engines' logs; nil discards them.
	Logger *slog.Logger
	// Tweak, if set, adjusts each interface's Config before it is created
	// (queue sizes, budgets): the knob for engine experiments.
	Tweak func(*ipoibcm.Config)
	// OnStop, if set, receives both interfaces' statistics (A first) when
	// the link stops, before the interfaces close: what went over RC and
	// UD, and every drop.
	OnStop func(a, b ipoibcm.Stats)
}

// IBLink returns a LinkFactory that joins two hosts with ib0: one soft
// fabric, a device per host, and an ipoibcm.Interface on each with the
// host as its host port. Neighbours are learnt the way a real ib0 learns
// them, by the hosts' own ARP through the engines. The interfaces own
// the hosts from then on: stop closes both (closing a Host twice is
// harmless), then the fabric; calling stop again does nothing.
func IBLink(cfg IBLinkConfig) LinkFactory {
	return func(a, b *netstack.Host) (func(), error) {
		return startIBLink(cfg, a, b)
	}
}

// ibLink is one running ib0 link.
type ibLink struct {
	fab  *soft.Fabric
	ifcs []*ipoibcm.Interface
}

func startIBLink(cfg IBLinkConfig, a, b *netstack.Host) (func(), error) {
	if cfg.MTU == 0 {
		cfg.MTU = a.MTU()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &ibLink{fab: soft.NewFabric(soft.Config{Seed: cfg.Seed, ReceiveOrder: cfg.ReceiveOrder})}
	for k, host := range []*netstack.Host{a, b} {
		name := fmt.Sprintf("ib%d", k)
		dev, err := l.fab.NewDevice(name)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("ib link: soft device %s: %w", name, err), l.close())
		}
		icfg := ipoibcm.Config{
			Device: dev,
			Host:   host,
			Name:   name,
			Mode:   cfg.Mode,
			MTU:    cfg.MTU,
			Logger: log.With("if", name),
		}
		if cfg.Tweak != nil {
			cfg.Tweak(&icfg)
		}
		ifc, err := ipoibcm.New(icfg)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("ib link: %s: %w", name, err), l.close())
		}
		if err := ifc.Start(); err != nil {
			// Start closes the interface on failure.
			return nil, errors.Join(fmt.Errorf("ib link: start %s: %w", name, err), l.close())
		}
		l.ifcs = append(l.ifcs, ifc)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if cfg.OnStop != nil {
				cfg.OnStop(l.ifcs[0].Stats(), l.ifcs[1].Stats())
			}
			if err := l.close(); err != nil {
				log.Warn("ib link stop", "err", err)
			}
		})
	}, nil
}

// close stops the interfaces (each closes its host) and the fabric. It is
// called once: by stop, or by a failed start.
func (l *ibLink) close() error {
	var errs []error
	for _, ifc := range l.ifcs {
		if err := ifc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	l.ifcs = nil
	if l.fab != nil {
		errs = append(errs, l.fab.Close())
		l.fab = nil
	}
	return errors.Join(errs...)
}

// InProcHostConfig is the host template of the 'ipoib bench' table and the
// in-process benchmarks, the same for every link so that ratios compare
// links, not host settings: host GSO on, as TSO/GSO is on by default on a
// Linux host, and checksums computed and verified except where a frame
// arrives with them partial or HCA-verified (netstack's WriteFramesMeta,
// as Linux), so every frame on ib0 is one a kernel would accept. Whether the super frames reach the link
// whole is the link's choice (ipoibcm.OffloadPort's SetOffloads): the
// plain direct link and an engine that takes no TSO get them cut to the
// MTU by the host's link endpoint, as Linux's GSO cuts them for a device
// without TSO; the direct-gso link takes them whole. TrustRXChecksums with
// SkipTXChecksums was measured and not adopted: it sped the direct link up
// more than ib0 connected (whose extra copy, in the soft HCA, it does not
// touch), so connected/direct fell to 0.61-0.72 in all four interleaved
// A/B runs, while connected/datagram moved both ways within the noise.
func InProcHostConfig() netstack.Config {
	return netstack.Config{GSO: true}
}
