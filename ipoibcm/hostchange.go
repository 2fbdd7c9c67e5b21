package ipoibcm

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// What the host may do to its side of the interface at run time, and how
// the engine follows: `ip link set ib0 mtu X` within the mode's limit, `ip
// link set ib0 address M` always, `ip link set ib0 down|up` as Linux's
// ipoib_stop and ipoib_open (hostlink.go). The host port's owner (cmd/ipoib, from
// netlink link events) calls these; the engine never polls the host.

// ErrHostMTU is wrapped when the host set an MTU the mode cannot carry.
var ErrHostMTU = errors.New("host MTU outside the mode's limit")

// minHostMTU is the smallest IP MTU the engine follows: IPv4's 68 (RFC
// 791); below it no IP packet fits.
const minHostMTU = 68

// FollowHostMTU makes mtu the interface's MTU when the current mode can
// carry it (68..65520 connected, 68..IB MTU − 4 datagram). Otherwise the
// interface keeps its MTU and the error, wrapping ErrHostMTU, says why:
// the host's oversize packets are then answered with ICMP frag-needed /
// packet-too-big at the engine's MTU, never dropped silently.
func (i *Interface) FollowHostMTU(mtu int) error {
	return i.onControlLoop("follow host MTU", func() error { return i.followHostMTU(mtu) })
}

// followHostMTU runs on the control loop, ordered with mode switches.
func (i *Interface) followHostMTU(mtu int) error {
	m := Mode(i.mode.Load())
	limit := frame.CMMTU
	if m == ModeDatagram {
		limit = i.udMTU
	}
	if mtu < minHostMTU || mtu > limit {
		return fmt.Errorf("%s: host set MTU %d, %s mode carries %d..%d; staying at %d (larger packets get ICMP too-big): %w",
			i.cfg.Name, mtu, m, minHostMTU, limit, i.MTU(), ErrHostMTU)
	}
	if old := int(i.mtu.Swap(int64(mtu))); old != mtu {
		i.hostMTUStale = false
		i.log.Info("MTU follows the host", "mtu", mtu, "was", old, "mode", m)
	}
	return nil
}

// FollowHostLink follows the host setting ib0 down (up false) or up again,
// as Linux's ipoib_stop and ipoib_open do (hostlink.go). It returns once
// the engine has stopped or restarted; connections taken down finish
// their teardown on their own.
func (i *Interface) FollowHostLink(up bool) error {
	want := hostLinkDown
	if up {
		want = hostLinkUp
	}
	return i.onControlLoop("follow host link", func() error { return i.hostLinkTransition(want) })
}

// HostUp reports whether the engine has the host's ib0 up, that is not
// stopped by FollowHostLink(false).
func (i *Interface) HostUp() bool { return !i.hostLink.down() }

// FollowHostMAC makes mac the destination of every frame written to the
// host. A host that changes ib0's MAC and is not followed drops every
// frame the engine delivers, with no counter moving.
func (i *Interface) FollowHostMAC(mac net.HardwareAddr) error {
	if len(mac) != 6 || mac[0]&1 != 0 {
		return fmt.Errorf("%s: host MAC %v: want a 6-byte unicast address", i.cfg.Name, mac)
	}
	var m frame.MAC
	copy(m[:], mac)
	if old := i.hostMAC.swap(m); old != m {
		i.log.Info("host MAC changed; frames to the host follow it", "mac", net.HardwareAddr(m[:]), "was", net.HardwareAddr(old[:]))
	}
	return nil
}

// HostMAC is the MAC frames to the host are addressed to now.
func (i *Interface) HostMAC() net.HardwareAddr {
	m := i.hostMAC.load()
	return net.HardwareAddr(m[:])
}

// macCell holds a MAC the host may change at run time (FollowHostMAC)
// while the data paths read it per frame: packed into one atomic word.
type macCell struct{ v atomic.Uint64 }

func (c *macCell) load() frame.MAC            { return unpackMAC(c.v.Load()) }
func (c *macCell) store(m frame.MAC)          { c.v.Store(packMAC(m)) }
func (c *macCell) swap(m frame.MAC) frame.MAC { return unpackMAC(c.v.Swap(packMAC(m))) }

func packMAC(m frame.MAC) uint64 {
	var v uint64
	for _, b := range m {
		v = v<<8 | uint64(b)
	}
	return v
}

func unpackMAC(v uint64) frame.MAC {
	var m frame.MAC
	for k := len(m) - 1; k >= 0; k-- {
		m[k] = byte(v)
		v >>= 8
	}
	return m
}
