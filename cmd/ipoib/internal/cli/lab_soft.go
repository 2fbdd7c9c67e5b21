package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"

	"github.com/ipoibcm/ipoib/capture"
	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/metrics"
	"github.com/ipoibcm/ipoib/tap"
)

// This file builds ipoibcm Interfaces on hca/soft devices with kernel TAPs
// as host ports: the lab ('ipoib fabric') and the ib0 rows of 'ipoib bench
// --iperf'.

var _ ipoibcm.MultiQueuePort = (*tap.Device)(nil)

// newSoftFabric creates an in-process soft fabric of hosts, whose hosts
// export their metrics to m (nil: none).
func newSoftFabric(seed int64, m *metrics.Metrics, log *slog.Logger) *softFabric {
	// Newest-first receive keeps the few buffers in flight cache-hot: the
	// fabric's copy is the "wire", and cold buffers doubled its cost. The
	// capture mux costs one atomic load per message while nobody captures.
	mux := &capture.Mux{}
	fab := soft.NewFabric(soft.Config{Seed: seed, ReceiveOrder: soft.ReceiveNewestFirst, Tap: mux})
	return &softFabric{fab: fab, mux: mux, metrics: m, log: log}
}

// softFabric is one soft fabric of hosts.
type softFabric struct {
	fab     *soft.Fabric
	mux     *capture.Mux
	metrics *metrics.Metrics
	log     *slog.Logger
}

// AddHost creates a device on the fabric and an IPoIB interface named
// ifname on it with dev as its host port, and starts it. The host owns dev
// from then on: softHost.Close closes it. Its P_Key children get their
// TAPs in ns (nil: the caller's namespace).
func (f *softFabric) AddHost(host, ifname string, ns *tap.Netns, dev *tap.Device, addrs []netip.Prefix, mode string, mtu int) (*softHost, error) {
	m, err := ipoibcm.ParseMode(mode)
	if err != nil {
		return nil, err
	}
	hd, err := f.fab.NewDevice(host)
	if err != nil {
		return nil, fmt.Errorf("soft device: %w", err)
	}
	log := f.log.With("host", host)
	config := func(name string, port ipoibcm.HostPort) ipoibcm.Config {
		return ipoibcm.Config{
			Device: hd,
			Host:   port,
			Name:   name,
			Mode:   m,
			MTU:    mtu,
			// The soft fabric delivers completion events on the poster's
			// goroutine: the peer's sender writes to this host itself.
			InlineRX: true,
			Logger:   log,
			Events:   ipoibcm.Observers(f.mux.Observer(host), f.metricsObserver(host)),
		}
	}
	ifc, err := ipoibcm.New(config(ifname, dev))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("ipoibcm: %w", err), hd.Close())
	}
	if err := ifc.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("ipoibcm start: %w", err), ifc.Close(), hd.Close())
	}
	// The engine owns the MTU (mode default or capped); make the kernel
	// side agree from the start.
	if err := dev.SetMTU(ifc.MTU()); err != nil {
		return nil, errors.Join(err, ifc.Close(), hd.Close())
	}
	view, err := watchHost(dev, ifc, f.log.With("host", host))
	if err != nil {
		return nil, errors.Join(err, ifc.Close(), hd.Close())
	}
	if f.metrics != nil {
		f.metrics.Add(metrics.Source{Host: host, Stats: ifc.Stats})
	}
	h := &softHost{host: host, ifc: ifc, dev: hd, mux: f.mux, addrs: addrs, view: view}
	h.kids = childSet{host: host, parent: ifc, log: log, config: config, admit: admitSoft(hd),
		open: func(name string, addrs []netip.Prefix) (*tap.Device, error) {
			return tap.Open(tap.Config{Name: name, Netns: ns, Link: tap.LinkConfig{Addrs: addrs}})
		}}
	return h, nil
}

func (f *softFabric) metricsObserver(host string) ipoibcm.EventObserver {
	if f.metrics == nil {
		return nil
	}
	return f.metrics.Observer(host)
}

func (f *softFabric) Close() error { return f.fab.Close() }

// softHost adapts an ipoibcm.Interface to the control socket.
type softHost struct {
	host  string
	ifc   *ipoibcm.Interface
	dev   *soft.Device
	mux   *capture.Mux
	addrs []netip.Prefix
	// view follows the kernel TAP; nil when the host port is not one
	// (the tests' gVisor hosts).
	view *hostView
	// kids are the P_Key children (ipoib child add, fabric --partition).
	kids childSet
}

// AddChild creates a P_Key child (control.ChildParent). The soft fabric
// stands in for the subnet manager: the partition joins the device's
// P_Key table if it is not there.
func (h *softHost) AddChild(req control.ChildRequest) (control.Endpoint, error) {
	return h.kids.add(req)
}

// DeleteChild removes the child named name (control.ChildParent).
func (h *softHost) DeleteChild(name string) error { return h.kids.del(name) }

// Children lists the children (control.ChildParent).
func (h *softHost) Children() []control.Endpoint { return h.kids.endpoints() }

// Capture records the host's side of the fabric (control.Capturer) until
// ctx ends or the file holds req.Count packets.
func (h *softHost) Capture(ctx context.Context, req control.CaptureRequest, w io.Writer) error {
	return captureTo(ctx, h.mux, h.host, req, w)
}

// captureTo streams what mux sees (of host, if not empty) to w as pcapng
// until ctx ends or the file holds req.Count packets.
func captureTo(ctx context.Context, mux *capture.Mux, host string, req control.CaptureRequest, w io.Writer) error {
	kind, err := capture.ParseKind(req.Kind)
	if err != nil {
		return err
	}
	s, err := capture.NewStream(w, capture.StreamConfig{
		Filter:     capture.Filter{Host: host, QPN: hca.QPN(req.QPN), Kind: kind},
		MaxPackets: req.Count,
	})
	if err != nil {
		return err
	}
	detach := mux.Attach(s)
	select {
	case <-ctx.Done():
	case <-s.Done():
	}
	detach()
	return s.Close()
}

func (h *softHost) Info() control.InterfaceInfo {
	if h.view != nil {
		return h.view.info(h.host, h.addrs)
	}
	return interfaceInfo(h.host, h.ifc, h.addrs)
}

// Stats is the engine's snapshot with the soft fabric's view of the
// host's device added as "soft": the multicast groups its QPs are
// attached to and the messages of each group the fabric delivered to it,
// so 'ipoib show' tells a group left at the fabric from one the host
// merely stopped reading.
func (h *softHost) Stats() any {
	return statsWithDevice(h.ifc.Stats(), "soft", map[string]any{"mcast": h.dev.McastStats()})
}

// statsWithDevice is the engine's snapshot s with a backend's device
// counters dev added under key.
func statsWithDevice(s ipoibcm.Stats, key string, dev any) any {
	eng, err := json.Marshal(s)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(eng, &m); err != nil {
		return map[string]any{"error": err.Error()}
	}
	d, err := json.Marshal(dev)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	m[key] = d
	return m
}

func (h *softHost) SetMode(mode string) error { return setInterfaceMode(h.ifc, mode) }

// Close stops the children, the interface (which closes its TAP) and
// then its device.
func (h *softHost) Close() error {
	kidsErr := h.kids.closeAll()
	if h.view != nil {
		h.view.Close()
	}
	return errors.Join(kidsErr, h.ifc.Close(), h.dev.Close())
}
