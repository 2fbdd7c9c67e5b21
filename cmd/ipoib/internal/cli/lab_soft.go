package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap"
)

// This file builds ipoibcm Interfaces on hca/soft devices with kernel TAPs
// as host ports: the lab ('ipoib fabric') and the ib0 rows of 'ipoib bench
// --iperf'.

var _ ipoibcm.HostPort = (*tap.Device)(nil)

// newSoftFabric creates an in-process soft fabric of hosts.
func newSoftFabric(seed int64, log *slog.Logger) *softFabric {
	// Newest-first receive keeps the few buffers in flight cache-hot: the
	// fabric's copy is the "wire", and cold buffers doubled its cost.
	return &softFabric{fab: soft.NewFabric(soft.Config{Seed: seed, ReceiveOrder: soft.ReceiveNewestFirst}), log: log}
}

// softFabric is one soft fabric of hosts.
type softFabric struct {
	fab *soft.Fabric
	log *slog.Logger
}

// AddHost creates a device on the fabric and an IPoIB interface named
// ifname on it with dev as its host port, and starts it. The host owns dev
// from then on: softHost.Close closes it.
func (f *softFabric) AddHost(host, ifname string, dev *tap.Device, addrs []netip.Prefix, mode string, mtu int) (*softHost, error) {
	m, err := ipoibcm.ParseMode(mode)
	if err != nil {
		return nil, err
	}
	hd, err := f.fab.NewDevice(host)
	if err != nil {
		return nil, fmt.Errorf("soft device: %w", err)
	}
	ifc, err := ipoibcm.New(ipoibcm.Config{
		Device: hd,
		Host:   dev,
		Name:   ifname,
		Mode:   m,
		MTU:    mtu,
		Logger: f.log.With("host", host),
	})
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
	return &softHost{host: host, ifc: ifc, dev: hd, addrs: addrs}, nil
}

func (f *softFabric) Close() error { return f.fab.Close() }

// softHost adapts an ipoibcm.Interface to the control socket.
type softHost struct {
	host  string
	ifc   *ipoibcm.Interface
	dev   *soft.Device
	addrs []netip.Prefix
}

func (h *softHost) Info() control.InterfaceInfo { return interfaceInfo(h.host, h.ifc, h.addrs) }

func (h *softHost) Stats() any { return h.ifc.Stats() }

func (h *softHost) SetMode(mode string) error { return setInterfaceMode(h.ifc, mode) }

// Close stops the interface (which closes its TAP) and then its device.
func (h *softHost) Close() error {
	return errors.Join(h.ifc.Close(), h.dev.Close())
}
