package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/curve25519"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/ipoibcm/ipoib/tap"
)

// WireGuardOverhead is what wireguard-go adds to an inner packet over an
// IPv6 underlay (40 IP, 8 UDP, 16 data header, 16 tag; 60 over IPv4).
// The suite subtracts the IPv6 figure in both modes, as wg-quick does.
const WireGuardOverhead = 80

// wireGuardPort is the UDP port of both wireguard-go devices, each in its
// own namespace.
const wireGuardPort = 51820

// wireGuardLinkName names the TUN of each side.
const wireGuardLinkName = "wg0"

// wireGuardMTU is the inner MTU of the wireguard-go baseline: the largest
// packet whose encapsulation fits the veth.
func (c *RoCEv2SuiteConfig) wireGuardMTU() int { return c.VethMTU - WireGuardOverhead }

// netnsBind opens the bind's sockets inside ns whichever goroutine asks:
// the device opens them on Up, which its TUN event reader calls when the
// link comes up, on a thread in the suite's own namespace.
type netnsBind struct {
	conn.Bind
	ns *tap.Netns
}

func (b netnsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	derr := b.ns.Do(func() error {
		fns, actual, err = b.Bind.Open(port)
		return nil
	})
	return fns, actual, errors.Join(derr, err)
}

// netnsTUN reads the TUN's MTU inside ns: tun's MTU looks the link up by
// name in the caller's namespace, and the device asks on every link event.
type netnsTUN struct {
	tun.Device
	ns *tap.Netns
}

func (t netnsTUN) MTU() (mtu int, err error) {
	derr := t.ns.Do(func() error {
		mtu, err = t.Device.MTU()
		return nil
	})
	return mtu, errors.Join(derr, err)
}

// wireGuardKey is a Curve25519 key pair as wireguard-go's UAPI takes it.
type wireGuardKey struct{ private, public [32]byte }

func newWireGuardKey() (wireGuardKey, error) {
	var k wireGuardKey
	if _, err := rand.Read(k.private[:]); err != nil {
		return k, err
	}
	// Clamped as RFC 7748 says (X25519 clamps anyway; the stored key
	// then is the one used).
	k.private[0] &= 248
	k.private[31] = k.private[31]&127 | 64
	pub, err := curve25519.X25519(k.private[:], curve25519.Basepoint)
	if err != nil {
		return k, err
	}
	copy(k.public[:], pub)
	return k, nil
}

// wireGuardLink is the wireguard-go baseline: a device on a TUN in each
// namespace, peers of each other across the underlay.
type wireGuardLink struct {
	devs []*device.Device
}

// openWireGuard lays the underlay and joins a and b with wireguard-go,
// wg0 in each at mtu with addrA and addrB, and returns once both have
// completed a handshake.
func (c *RoCEv2SuiteConfig) openWireGuard(mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (*wireGuardLink, error) {
	if err := c.underlay(a, b); err != nil {
		return nil, err
	}
	keyA, err := newWireGuardKey()
	if err != nil {
		return nil, fmt.Errorf("wireguard-go: key: %w", err)
	}
	keyB, err := newWireGuardKey()
	if err != nil {
		return nil, fmt.Errorf("wireguard-go: key: %w", err)
	}
	l := &wireGuardLink{}
	for _, s := range []struct {
		name       string
		ns         *tap.Netns
		addr, peer netip.Prefix
		key, far   wireGuardKey
		endpoint   netip.Addr
	}{{"a", a, addrA, addrB, keyA, keyB, c.UnderlayB.Addr()}, {"b", b, addrB, addrA, keyB, keyA, c.UnderlayA.Addr()}} {
		uapi := wireGuardUAPI(s.key, s.far, netip.AddrPortFrom(s.endpoint, wireGuardPort), netip.PrefixFrom(s.peer.Addr(), s.peer.Addr().BitLen()))
		dev, err := openWireGuardSide(s.ns, mtu, s.addr, uapi, wireGuardLogger(c.Progress, s.name))
		if err != nil {
			return nil, errors.Join(err, l.Close())
		}
		l.devs = append(l.devs, dev)
	}
	if err := l.awaitHandshake(c.ReadyTimeout); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// wireGuardUAPI configures a device with key, listening on the baseline's
// port, and its one peer far at endpoint, routed peer. The persistent
// keepalive makes each side start the handshake as it comes up (and
// once every 25 s the link stays idle, which a test run never does).
func wireGuardUAPI(key, far wireGuardKey, endpoint netip.AddrPort, peer netip.Prefix) string {
	return fmt.Sprintf("private_key=%s\nlisten_port=%d\nreplace_peers=true\npublic_key=%s\nendpoint=%s\nallowed_ip=%s\npersistent_keepalive_interval=25\n",
		hex.EncodeToString(key.private[:]), wireGuardPort, hex.EncodeToString(far.public[:]), endpoint, peer)
}

// openWireGuardSide creates wg0 in ns, runs a device with uapi on it and
// brings the link up with addr.
func openWireGuardSide(ns *tap.Netns, mtu int, addr netip.Prefix, uapi string, log *device.Logger) (*device.Device, error) {
	var dev *device.Device
	err := ns.Do(func() error {
		t, err := tun.CreateTUN(wireGuardLinkName, mtu)
		if err != nil {
			return err
		}
		// wireguard-go's Linux TUN reads and writes in batches only with
		// the vnet header and TSO in force (TUNSETOFFLOAD); without them
		// this row would measure a packet-at-a-time tunnel.
		if t.BatchSize() < conn.IdealBatchSize {
			return errors.Join(fmt.Errorf("TUN batch %d, want %d: kernel refused the vnet header or TSO", t.BatchSize(), conn.IdealBatchSize), t.Close())
		}
		dev = device.NewDevice(netnsTUN{t, ns}, netnsBind{conn.NewDefaultBind(), ns}, log)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wireguard-go in %s: %w", ns.Name(), err)
	}
	if err := dev.IpcSet(uapi); err != nil {
		dev.Close()
		return nil, fmt.Errorf("wireguard-go in %s: configure: %w", ns.Name(), err)
	}
	if err := ns.ConfigureLink(wireGuardLinkName, tap.LinkConfig{Addrs: []netip.Prefix{addr}, Up: true}); err != nil {
		dev.Close()
		return nil, fmt.Errorf("wireguard-go: %w", err)
	}
	// The link's up event brings the device up too, later; this opens the
	// sockets now and reports a failure.
	if err := dev.Up(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("wireguard-go in %s: up: %w", ns.Name(), err)
	}
	return dev, nil
}

// wireGuardLogger sends the device's errors to progress, prefixed by
// side; its verbose lines are dropped.
func wireGuardLogger(progress io.Writer, side string) *device.Logger {
	l := &device.Logger{Verbosef: device.DiscardLogf, Errorf: device.DiscardLogf}
	if progress != nil {
		l.Errorf = func(format string, args ...any) {
			fmt.Fprintf(progress, "wireguard-go %s: %s\n", side, fmt.Sprintf(format, args...))
		}
	}
	return l
}

// awaitHandshake waits until every device has completed a handshake with
// its peer.
func (l *wireGuardLink) awaitHandshake(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for k := range l.devs {
		for {
			p, err := l.peer(k)
			if err != nil {
				return err
			}
			if p["last_handshake_time_sec"] != "0" && p["last_handshake_time_sec"] != "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("wireguard-go: no handshake within %v", timeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// peer returns the UAPI keys of device k's peer (the lines after its
// public_key).
func (l *wireGuardLink) peer(k int) (map[string]string, error) {
	s, err := l.devs[k].IpcGet()
	if err != nil {
		return nil, fmt.Errorf("wireguard-go: %w", err)
	}
	m := map[string]string{}
	inPeer := false
	for line := range strings.SplitSeq(s, "\n") {
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if key == "public_key" {
			inPeer = true
		}
		if inPeer {
			m[key] = value
		}
	}
	return m, nil
}

// transfer returns the bytes device k sent to and received from its peer.
func (l *wireGuardLink) transfer(k int) (tx, rx int64, err error) {
	p, err := l.peer(k)
	if err != nil {
		return 0, 0, err
	}
	tx, terr := strconv.ParseInt(p["tx_bytes"], 10, 64)
	rx, rerr := strconv.ParseInt(p["rx_bytes"], 10, 64)
	if err := errors.Join(terr, rerr); err != nil {
		return 0, 0, fmt.Errorf("wireguard-go: peer counters: %w", err)
	}
	return tx, rx, nil
}

// Close stops both devices: Device.Close closes the TUN and the sockets
// and waits for their readers; the crypto workers end as their queues
// drain and close, just after.
func (l *wireGuardLink) Close() error {
	for _, d := range l.devs {
		d.Close()
	}
	l.devs = nil
	return nil
}

// buildWireGuard is the wireguard-go baseline as a linkBuilder.
func (c *RoCEv2SuiteConfig) buildWireGuard(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	l, err := c.openWireGuard(mtu, a, b, addrA, addrB)
	if err != nil {
		return nil, err
	}
	return l.Close, nil
}
