package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/capture"
	"github.com/ipoibcm/ipoib/cmd/ipoib/internal/config"
	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/metrics"
	"github.com/ipoibcm/ipoib/tap"
)

// This file is 'ipoib up': one ib0 on this host, a kernel TAP in front of
// an ipoibcm.Interface on a RoCEv2/UDP device, served on the control
// socket like the fabric's hosts.

// upHost is a running 'ipoib up' interface: the control socket's view.
type upHost struct {
	name  string
	ifc   *ipoibcm.Interface
	dev   *rocev2.Device
	mux   *capture.Mux // the device's tap; nil: cannot capture
	addrs []netip.Prefix
	// view follows the kernel TAP; nil when the host port is not one
	// (the tests' gVisor hosts).
	view *hostView
	// kids are the P_Key children (ipoib child add).
	kids childSet
	// peers samples the peers' activity; nil: not tracked.
	peers *peerTracker
}

// AddChild creates a P_Key child (control.ChildParent), its TAP next to
// the parent's.
func (h *upHost) AddChild(req control.ChildRequest) (control.Endpoint, error) { return h.kids.add(req) }

// DeleteChild removes the child named name (control.ChildParent).
func (h *upHost) DeleteChild(name string) error { return h.kids.del(name) }

// Children lists the children (control.ChildParent).
func (h *upHost) Children() []control.Endpoint { return h.kids.endpoints() }

var (
	_ control.Endpoint = (*upHost)(nil)
	_ control.Capturer = (*upHost)(nil)
)

// Capture records what the RoCEv2 device sends and accepts (control.Capturer).
func (h *upHost) Capture(ctx context.Context, req control.CaptureRequest, w io.Writer) error {
	if h.mux == nil {
		return errors.New("capture: this device has no tap")
	}
	return captureTo(ctx, h.mux, "", req, w)
}

func (h *upHost) Info() control.InterfaceInfo {
	if h.view != nil {
		return h.view.info(h.name, h.addrs)
	}
	return interfaceInfo(h.name, h.ifc, h.addrs)
}

// Stats is the engine's snapshot with the RoCEv2 device's counters (per
// drop reason, retransmits, injected faults) added as "rocev2", so 'ipoib
// show' prints them with the interface.
//
// With a peer tracker (a running 'ipoib up') it adds each peer's last
// receive and retransmits as control.PeerActivityKey.
func (h *upHost) Stats() any {
	st := h.ifc.Stats()
	out := statsWithDevice(st, "rocev2", h.dev.Stats())
	if h.peers == nil {
		return out
	}
	act := h.peers.activity(time.Now(), st, func(qpn uint32) uint64 {
		n, _ := h.dev.QPRetransmits(hca.QPN(qpn))
		return n
	})
	return withSection(out, control.PeerActivityKey, act)
}

func (h *upHost) SetMode(mode string) error { return setInterfaceMode(h.ifc, mode) }

// upDeviceConfig is the RoCEv2 device of 'ipoib up' o, with the default
// allow list (the peers and the bind address's subnet) filled in.
func upDeviceConfig(o UpOptions, log *slog.Logger) (rocev2.Config, error) {
	allow := o.Allow
	if allow == nil {
		var err error
		if allow, err = defaultAllow(o.Bind.Addr(), o.Peers); err != nil {
			return rocev2.Config{}, err
		}
	}
	return rocev2.Config{
		Bind:      o.Bind,
		Peers:     o.Peers,
		Multicast: o.Multicast,
		Gossip:    !o.Multicast,
		Allow:     allow,
		PKeys:     upPKeyTable(o.PKey, o.PKeyTable),
		MTU:       hca.MTU(o.IBMTU),
		Faults: rocev2.Faults{Seed: o.Seed, Drop: o.Loss, Duplicate: o.Dup, Reorder: o.Reorder,
			Delay: o.Delay, DelayTime: o.DelayTime},
		MinAckTimeout: o.AckTimeout,
		DisableGSO:    !o.UDPOffload,
		DisableGRO:    !o.UDPOffload,
		Logger:        log,
		Name:          "rocev2:" + o.Bind.String(),
	}, nil
}

// upInterfaceConfig is the engine of 'ipoib up' o on dev, in front of
// host.
func upInterfaceConfig(o UpOptions, mode ipoibcm.Mode, dev hca.Device, host ipoibcm.HostPort, log *slog.Logger) ipoibcm.Config {
	return ipoibcm.Config{
		Device: dev, Host: host, Name: o.Dev, Mode: mode, MTU: o.MTU, PKey: upPartition(o.PKey), RCRetry: o.RCRetry, Logger: log,
		MaxRXConns: o.MaxRXConns, MaxRXConnsPerGID: o.MaxRXConnsPerPeer,
		// The UD ring is set on its own: left 0 it would follow the SRQ.
		RecvQueueSize: o.RecvQueueSize, MaxRecvQueueSize: o.RecvQueueMax, UDRecvQueueSize: ipoibcm.DefaultUDRecvQueueSize,
		CM: cm.Options{MaxHalfOpen: o.MaxHalfOpen},
	}
}

// runUp brings the interface up, serves the control socket until ctx ends
// and removes everything. Failures before the interface runs wrap
// ErrSetup.
func runUp(ctx context.Context, o UpOptions, log *slog.Logger) (err error) {
	setup := func(err error) error { return fmt.Errorf("%w: %w", ErrSetup, err) }
	var cleanup []func() error
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanup[i]())
		}
	}()
	mode, err := ipoibcm.ParseMode(o.Mode)
	if err != nil {
		return setup(err)
	}
	if err := checkUnderlay(o.Bind.Addr(), o.Peers, o.Multicast, o.IBMTU); err != nil {
		return setup(err)
	}
	mux := &capture.Mux{}
	dcfg, err := upDeviceConfig(o, log)
	if err != nil {
		return setup(err)
	}
	dcfg.Tap = mux
	dev, err := rocev2.New(dcfg)
	if err != nil {
		return setup(fmt.Errorf("RoCEv2 device on %v: %w", o.Bind, err))
	}
	cleanup = append(cleanup, dev.Close)
	port, err := tap.Open(tap.Config{Name: o.Dev, VnetHdr: o.Offloads, Queues: o.Queues, Link: tap.LinkConfig{Addrs: []netip.Prefix{o.Addr}}})
	if err != nil {
		return setup(fmt.Errorf("TAP %s: %w", o.Dev, err))
	}
	// The metrics registry exists even with no address, so a reload can
	// start serving it: its observer counts connection events only.
	m := metrics.New()
	events := m.Observer(o.Host)
	icfg := upInterfaceConfig(o, mode, dev, port, log)
	icfg.Events = ipoibcm.Observers(events, mux.Observer(o.Host))
	ifc, err := ipoibcm.New(icfg)
	if err != nil {
		return setup(errors.Join(fmt.Errorf("ipoibcm: %w", err), port.Close()))
	}
	if err := ifc.Start(); err != nil {
		return setup(errors.Join(fmt.Errorf("ipoibcm start: %w", err), ifc.Close()))
	}
	// Interface.Close closes the TAP, which removes it from the kernel.
	cleanup = append(cleanup, ifc.Close)
	if err := port.SetMTU(ifc.MTU()); err != nil {
		return setup(fmt.Errorf("TAP %s MTU %d: %w", o.Dev, ifc.MTU(), err))
	}
	view, err := watchHost(port, ifc, log)
	if err != nil {
		return setup(err)
	}
	cleanup = append(cleanup, func() error { view.Close(); return nil })
	h := &upHost{name: o.Host, ifc: ifc, dev: dev, mux: mux, addrs: []netip.Prefix{o.Addr}, view: view, peers: newPeerTracker(peerSample)}
	h.kids = childSet{host: o.Host, parent: ifc, log: log, admit: fixedPKeyTable(dev),
		config: func(name string, port ipoibcm.HostPort) ipoibcm.Config {
			c := upInterfaceConfig(o, mode, dev, port, log)
			c.Name, c.Events = name, icfg.Events
			return c
		},
		open: func(name string, addrs []netip.Prefix) (*tap.Device, error) {
			return tap.Open(tap.Config{Name: name, Link: tap.LinkConfig{Addrs: addrs}})
		}}
	cleanup = append(cleanup, h.kids.closeAll)
	for _, c := range o.Children {
		if _, err := h.kids.add(childRequest(c)); err != nil {
			return setup(fmt.Errorf("%s:%d: child %s: %w", o.ConfigPath, c.Line, c.Name, err))
		}
	}
	srv, err := control.Listen(o.ControlDir, []control.Endpoint{h}, log)
	if err != nil {
		return setup(err)
	}
	cleanup = append(cleanup, srv.Close)
	m.Add(metrics.Source{Host: o.Host, Stats: ifc.Stats, DeviceName: "rocev2", Device: func() any { return dev.Stats() }})
	svc, err := newUpService(o, h, m, log)
	if err != nil {
		return setup(err)
	}
	cleanup = append(cleanup, svc.close)
	srv.SetProcess(svc)
	log.Info("up; stop with Ctrl-C", "dev", o.Dev, "addr", o.Addr, "bind", dev.LocalAddr(), "hwaddr", ifc.HWAddr(),
		"mode", ifc.Mode(), "mtu", ifc.MTU(), "peers", o.Peers, "multicast", o.Multicast, "allow", dcfg.Allow,
		"children", len(o.Children), "config", o.ConfigPath, "control", srv.Path())
	if o.Ready != nil {
		o.Ready(srv.Path())
	}
	svc.run(ctx)
	log.Info("shutting down", "dev", o.Dev)
	return nil
}

// childRequest is a config file's child as 'ipoib child add' asks.
func childRequest(c config.Child) control.ChildRequest {
	r := control.ChildRequest{PKey: c.PKey, Name: c.Name}
	for _, a := range c.Addrs {
		r.Addrs = append(r.Addrs, a.String())
	}
	return r
}

// upPKeyTable is the RoCEv2 port's P_Key table for 'ipoib up --pkey
// pkey --pkey-table more' (pkey 0: none given): the default partition
// first, then pkey and more as given, bit 15 the membership, there being
// no subnet manager to write it; a partition given twice keeps its first.
func upPKeyTable(pkey hca.PKey, more []hca.PKey) []hca.PKey {
	table := []hca.PKey{hca.PKeyDefault}
	if pkey&0x7FFF == 0x7FFF {
		table[0] = pkey
	}
	for _, k := range append([]hca.PKey{pkey}, more...) {
		if k != 0 && !slices.ContainsFunc(table, func(t hca.PKey) bool { return t&0x7FFF == k&0x7FFF }) {
			table = append(table, k)
		}
	}
	return table
}

// upPartition is the engine's partition for --pkey: the P_Key with the
// full-membership bit, as Linux sets it for the broadcast group (the
// table says whether the port is a full member); 0 is the default.
func upPartition(pkey hca.PKey) hca.PKey {
	if pkey == 0 {
		return hca.PKeyDefault
	}
	return pkey | 0x8000
}

// fixedPKeyTable admits a child only in a partition the port's table
// (--pkey, --pkey-table) has: no subnet manager runs over RoCEv2 to add
// one later, so a child outside it would stay down for good.
func fixedPKeyTable(dev hca.Device) func(hca.PKey) (func(), error) {
	return func(pkey hca.PKey) (func(), error) {
		port := dev.Port()
		if _, ok := port.PKeyIndex(pkey); !ok {
			var tbl []string
			for _, k := range port.PKeys {
				tbl = append(tbl, fmt.Sprintf("0x%04x", uint16(k)))
			}
			return nil, fmt.Errorf("partition 0x%04x is not in this port's P_Key table (%s); start 'ipoib up' with it in --pkey-table", uint16(pkey|0x8000), strings.Join(tbl, ", "))
		}
		return func() {}, nil
	}
}
