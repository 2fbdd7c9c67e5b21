package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
	"github.com/ipoibcm/ipoib/metrics"
	"github.com/ipoibcm/ipoib/tap"
)

// maxHosts bounds --hosts; each host costs a namespace, a TAP and an
// engine with its goroutines.
const maxHosts = 254

// fabricHosts checks --hosts. One host is refused, not run: its ib0 has
// no peer on the fabric (its own addresses are local to its namespace,
// so not one packet would cross the engine), and a lab that carries
// nothing looks like a broken one (docs/decisions.md).
func fabricHosts(n int) string {
	if n == 1 {
		return "--hosts 1: a fabric needs at least 2 hosts (one host's ib0 has no peer to carry a packet to)"
	}
	return flagcheck.IntRange("hosts", n, 2, maxHosts)
}

func fabricFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	hosts := fs.Int("hosts", 2, "number of hosts (namespaces ipoib-h1..ipoib-hN, each with an ib0)")
	prefix := fs.String("prefix", "10.77.0.0/24", "IPv4 prefix; host i gets address i of it (.1, .2, ...)")
	ifname := fs.String("ifname", "ib0", "name of the TAP device in each namespace")
	seed := fs.Int64("seed", 1, "soft fabric random seed")
	dir := controlDirFlag(fs, env)
	netnsPrefix := fs.String("netns-prefix", "ipoib-h", "namespace names are this prefix plus the host number")
	prof := addProfileFlags(fs)
	ib := declareIBFlags(fs, "ib0", "each TAP")
	parts := &partitionsFlag{}
	fs.Var(parts, "partition", "put hosts into a partition, as the subnet manager would: PKEY=HOST[:limited],... (e.g. 0x8001=1,2,3:limited); each member's P_Key table gets it and an <ifname>.8001 child with address i of the N-th subnet after --prefix (10.77.N.i/24) for the N-th --partition; repeatable")
	return func(ctx context.Context, args []string) int {
		var pfx netip.Prefix
		var addrs []netip.Prefix
		msg := firstBroken(append([]rule{
			noArgs(args),
			func() string {
				if *netnsPrefix == "" || len(*netnsPrefix) > 24 || strings.ContainsAny(*netnsPrefix, "/ \t\n") {
					return fmt.Sprintf("--netns-prefix %q: want 1..24 characters without '/' or spaces", *netnsPrefix)
				}
				return ""
			},
			func() string { return fabricHosts(*hosts) },
			check(flagcheck.Ifname("ifname", *ifname)),
			func() string {
				var err error
				if pfx, err = netip.ParsePrefix(*prefix); err != nil || !pfx.Addr().Is4() {
					return fmt.Sprintf("--prefix %q: want an IPv4 prefix like 10.77.0.0/24", *prefix)
				}
				if addrs, err = hostAddrs(pfx, *hosts); err != nil {
					return err.Error()
				}
				return ""
			},
			func() string { return parts.check(*hosts, pfx) },
		}, append(ib.rules(func() int { return fabricIBMTU }), prof.rules()...)...)...)
		if msg != "" {
			return usageError(env, "fabric", msg)
		}
		if env.Euid() != 0 {
			return refuse(env, "fabric", "needs root to create network namespaces and TAP devices; without root, 'ipoib bench' measures the same engine in-process")
		}
		log := newLogger(env.Stderr, ib.lvl.level)
		stopProfile, err := prof.start()
		if err != nil {
			return fail(env, "fabric", err)
		}
		var m *metrics.Metrics
		if *ib.metrics != "" {
			m = metrics.New()
			srv, err := metrics.Serve(*ib.metrics, m, log)
			if err != nil {
				return fail(env, "fabric", errors.Join(err, stopProfile()))
			}
			defer srv.Close()
			log.Info("metrics", "url", "http://"+srv.Addr().String()+"/metrics")
		}
		lab := fabricLab{env: env, log: log, owner: &tap.Owner{MarkerDir: env.MarkerDir, Logger: log}, netnsPrefix: *netnsPrefix, metrics: m,
			offloads: *ib.offloads == "on", queues: *ib.queues, partitions: parts.parts, prefix: pfx}
		err = lab.run(ctx, addrs, *ib.mode, *ib.mtu, *ifname, *seed, *dir)
		if err = errors.Join(err, stopProfile()); err != nil {
			return fail(env, "fabric", err)
		}
		return ExitOK
	}
}

// hostAddrs gives host i (1-based) address i of the prefix, keeping the
// prefix length.
func hostAddrs(pfx netip.Prefix, n int) ([]netip.Prefix, error) {
	pfx = pfx.Masked()
	if hostBits := 32 - pfx.Bits(); hostBits < 31 && n > (1<<hostBits)-2 {
		return nil, fmt.Errorf("--prefix %s has room for %d hosts, not %d", pfx, (1<<hostBits)-2, n)
	}
	out := make([]netip.Prefix, n)
	a := pfx.Addr()
	for i := range out {
		a = a.Next()
		out[i] = netip.PrefixFrom(a, pfx.Bits())
	}
	return out, nil
}

type fabricLab struct {
	env   *Env
	log   *slog.Logger
	owner *tap.Owner
	// netnsPrefix names the namespaces (prefix + host number).
	netnsPrefix string
	// metrics, if set, exports every host (--metrics).
	metrics *metrics.Metrics
	// offloads opens the TAPs with IFF_VNET_HDR (--offloads).
	offloads bool
	// queues is each TAP's queue count (--queues).
	queues int
	// partitions are the --partition flags; prefix is --prefix, after
	// which their subnets come.
	partitions []partition
	prefix     netip.Prefix

	namespaces []*tap.Netns
	hosts      []*softHost
	fabric     *softFabric
	server     *control.Server
}

// run builds the lab, serves until ctx ends (SIGINT/SIGTERM), and removes
// everything it created whatever happened.
func (l *fabricLab) run(ctx context.Context, addrs []netip.Prefix, mode string, mtu int, ifname string, seed int64, controlDir string) (err error) {
	if removed, err := l.owner.CleanupStale(); err != nil {
		return err
	} else if len(removed) > 0 {
		l.log.Info("removed a crashed run's namespaces", "names", removed)
	}
	defer func() { err = errors.Join(err, l.teardown()) }()
	l.fabric = newSoftFabric(seed, l.metrics, l.log)
	var endpoints []control.Endpoint
	for i, addr := range addrs {
		prefix := l.netnsPrefix
		if prefix == "" {
			prefix = "ipoib-h"
		}
		name := fmt.Sprintf("%s%d", prefix, i+1)
		ns, err := l.owner.Create(name)
		if err != nil {
			return netnsTakenHint(err)
		}
		l.namespaces = append(l.namespaces, ns)
		// The engine raises the link once it has joined the broadcast
		// group (HostPort.SetLinkUp).
		dev, err := tap.Open(tap.Config{Name: ifname, Netns: ns, VnetHdr: l.offloads, Queues: l.queues, Link: tap.LinkConfig{Addrs: []netip.Prefix{addr}}})
		if err != nil {
			return err
		}
		h, err := l.fabric.AddHost(name, ifname, ns, dev, []netip.Prefix{addr}, mode, mtu)
		if err != nil {
			dev.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		l.hosts = append(l.hosts, h)
		endpoints = append(endpoints, h)
		l.log.Info("host up", "host", name, "dev", ifname, "addr", addr, "mode", h.Info().Mode, "mtu", h.Info().MTU)
	}
	if err := l.partition(ifname); err != nil {
		return err
	}
	l.server, err = control.Listen(controlDir, endpoints, l.log)
	if err != nil {
		return err
	}
	l.log.Info("fabric ready; stop with Ctrl-C", "hosts", len(addrs), "control", l.server.Path(),
		"try", fmt.Sprintf("ip netns exec %s1 ping %s; ipoib show", l.netnsPrefix, addrs[len(addrs)-1].Addr()))
	if l.env.fabricReady != nil {
		l.env.fabricReady(l.server.Path())
	}
	<-ctx.Done()
	l.log.Info("shutting down")
	return nil
}

// partition puts the hosts into the --partition partitions: the P_Key
// table entry (the fabric is the subnet manager) and the child.
func (l *fabricLab) partition(ifname string) error {
	for k, pt := range l.partitions {
		subnet, err := partitionPrefix(l.prefix, k+1)
		if err != nil {
			return err
		}
		reqs, err := pt.childRequests(ifname, subnet)
		if err != nil {
			return fmt.Errorf("partition 0x%04x: %w", pt.pkey, err)
		}
		for _, m := range pt.members {
			h := l.hosts[m.host-1]
			if _, err := h.AddChild(reqs[m.host]); err != nil {
				return fmt.Errorf("%s: partition 0x%04x: %w", h.host, pt.pkey, err)
			}
		}
	}
	return nil
}

func (l *fabricLab) teardown() error {
	var errs []error
	if l.server != nil {
		errs = append(errs, l.server.Close())
	}
	for i := len(l.hosts) - 1; i >= 0; i-- {
		errs = append(errs, l.hosts[i].Close())
	}
	if l.fabric != nil {
		errs = append(errs, l.fabric.Close())
	}
	for i := len(l.namespaces) - 1; i >= 0; i-- {
		errs = append(errs, l.namespaces[i].Delete())
	}
	return errors.Join(errs...)
}

// netnsTakenHint adds what to do about a namespace name that is taken:
// whose it is the error says (tap.NetnsExistsError); a running ipoib's is
// left alone, a crashed one's 'ipoib cleanup' removes, anyone else's is
// theirs to delete.
func netnsTakenHint(err error) error {
	var ne *tap.NetnsExistsError
	if !errors.As(err, &ne) {
		return err
	}
	hint := fmt.Sprintf("remove it with 'ip netns delete %s' or give this run another --netns-prefix", ne.Name)
	switch {
	case ne.Running:
		hint = "stop that process or give this run another --netns-prefix"
	case ne.OwnerPID != 0:
		hint = "'ipoib cleanup' removes it"
	}
	return fmt.Errorf("%w; %s", err, hint)
}
