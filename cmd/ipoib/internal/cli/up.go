package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// ErrSetup marks an 'ipoib up' failure before the interface ran: an
// address in use, no permission for the TAP, a bind address that is not
// local. The command then exits with status 2, like a bad flag.
var ErrSetup = errors.New("setup failed")

// UpOptions is the validated command line of 'ipoib up'.
type UpOptions struct {
	Dev  string       // TAP name, e.g. ib0
	Addr netip.Prefix // IP prefix of the TAP
	HCA  string       // backend: "rocev2"
	// Bind is the local UDP address; its IP is the port GID.
	Bind  netip.AddrPort
	Peers []netip.Addr
	// Multicast sends the broadcast group and IP multicast as RoCEv2
	// multicast the network replicates (--multicast=on); false is
	// head-end replication to the members known.
	Multicast bool
	// Allow is the underlay source prefixes accepted; nil means the
	// default, --peers plus the bind address's connected subnet.
	Allow []netip.Prefix
	// MaxRXConns, MaxRXConnsPerPeer and MaxHalfOpen bound the passive
	// connections (ipoibcm.Config, cm.Options).
	MaxRXConns, MaxRXConnsPerPeer, MaxHalfOpen int
	// PKey is the partition of the device (0: the default, 0xffff), as
	// given: its bit 15 is the port's membership (--pkey).
	PKey hca.PKey
	// PKeyTable are more entries of the port's P_Key table
	// (--pkey-table): the partitions children may be added in.
	PKeyTable []hca.PKey
	Mode      string // "connected" or "datagram"
	MTU       int    // IP MTU; 0: the mode's default
	IBMTU     int    // IB path MTU, 1024..4096
	// Fault injection on the UDP transmit path, for tests.
	Loss, Dup, Reorder, Delay float64
	DelayTime                 time.Duration
	Seed                      uint64
	// RCRetry is the RC transport retry count the REQ carries and both
	// QPs use (Linux IPoIB asks for 0);
	// AckTimeout floors the RC transport timeout.
	RCRetry    uint8
	AckTimeout time.Duration
	// UDPOffload lets the RoCEv2 socket use UDP GSO and GRO where the
	// kernel has them.
	UDPOffload bool
	// Offloads opens the TAP with IFF_VNET_HDR, so super frames and
	// partial checksums cross it (--offloads).
	Offloads bool
	// Host names the interface on the control socket.
	Host       string
	ControlDir string
	// Metrics, if set, is the address of the Prometheus endpoint.
	Metrics string
	// Ready, if set, is called once the control socket serves.
	Ready func(controlPath string)
}

func upFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	dev := fs.String("dev", "ib0", "TAP device name")
	addr := fs.String("addr", "", "IP prefix of the device, e.g. 10.77.0.1/24 (required)")
	hcaName := fs.String("hca", "rocev2", "HCA backend: rocev2")
	bind := fs.String("bind", "", "local IP address for RoCEv2/UDP, e.g. 192.0.2.1 (required; its GID is ::ffff:<addr>)")
	port := fs.Uint("port", 4791, "UDP port of the fabric (every host uses the same)")
	peers := fs.String("peers", "", "comma-separated IP addresses of other hosts: with --multicast=off the seeds of head-end replication (members they know, and hosts heard from inside --allow, join too, up to 1024); optional with --multicast=on")
	multicast := fs.String("multicast", "on", "on: multicast UD goes to the IP group of its MGID and the network replicates (needs IGMP/MLD multicast on the link); off: head-end replication, one unicast copy per member")
	allow := fs.String("allow", "", "comma-separated underlay source prefixes to accept, or 'any'; others are dropped before parsing (default: --peers and the subnet --bind is on)")
	maxRX := fs.Int("max-rx-conns", 2048, "passive connections at most (REQs over it get REJ NO_QP); a peer holding an established one may replace it")
	maxRXPeer := fs.Int("max-rx-conns-per-peer", 4, "passive connections from one peer GID at most")
	maxHalfOpen := fs.Int("max-half-open", 256, "passive handshakes awaiting the peer's RTU at most; a REQ beyond evicts one of the source holding the most")
	mode := fs.String("mode", "connected", "initial mode: connected or datagram")
	pkey := fs.String("pkey", "0xffff", "partition of the device: its P_Key (0x8001); no subnet manager runs, so the port's P_Key table is {0xffff, this}, bit 15 clear making the port a limited member (0x0001)")
	pkeyTable := fs.String("pkey-table", "", "more comma-separated P_Keys for the port's table, the partitions 'ipoib child add' may use here (bit 15 the membership, as --pkey)")
	mtu := fs.Int("mtu", 0, "IP MTU of the device; 0 = the mode's default (65520 connected, IB MTU - 4 datagram)")
	ibMTU := fs.Int("ib-mtu", 4096, "IB path MTU: 1024, 2048 or 4096 (the UDP path must carry it plus 60 bytes)")
	loss := fs.Float64("loss", 0, "fault injection: probability of dropping an outgoing UDP datagram")
	dup := fs.Float64("dup", 0, "fault injection: probability of sending a datagram twice")
	reorder := fs.Float64("reorder", 0, "fault injection: probability of swapping a datagram with the next")
	delay := fs.Float64("delay", 0, "fault injection: probability of holding a datagram back by --delay-time")
	delayTime := fs.Duration("delay-time", time.Millisecond, "fault injection: how long --delay holds a datagram")
	seed := fs.Uint64("seed", 1, "fault injection random seed")
	rcRetry := fs.Uint("rc-retry", 6, "RC transport retry count the CM REQ asks for and both QPs use (0..7, 7 = forever): Linux IPoIB-CM asks for 0, which one lost UDP datagram would turn into a dropped connection")
	ackTimeout := fs.Duration("ack-timeout", 50*time.Millisecond, "RC transport (ACK) timeout at least: the go-back-N retransmit delay when a datagram is lost")
	offloads := fs.String("offloads", "on", "on: open the TAP with a virtio header so TSO/USO super frames and partial checksums cross it (UD LSO and checksum offload underneath, GRO toward the host); off: one complete frame per read and write")
	udpOffload := fs.Bool("udp-offload", true, "use UDP GSO/GRO on the RoCEv2 socket where the kernel has them (false: one datagram per send and receive)")
	host := fs.String("host", "", "name on the control socket (ipoib show/mode --host); default <dev>@<bind>")
	metricsAddr := fs.String("metrics", "", "serve Prometheus/OpenMetrics metrics at http://ADDR/metrics (e.g. 127.0.0.1:9101; empty: off)")
	lvl := &levelFlag{level: slog.LevelInfo}
	fs.Var(lvl, "log-level", "log level: debug, info, warn, error")
	dir := controlDirFlag(fs, env)
	prof := addProfileFlags(fs)
	return func(ctx context.Context, args []string) int {
		o, msg := parseUp(args, upRaw{*dev, *addr, *hcaName, *bind, *port, *peers, *mode, *mtu, *ibMTU, *multicast})
		if msg != "" {
			return usageError(env, "up", msg)
		}
		k, msg := flagcheck.PKey("--pkey", *pkey)
		if msg != "" {
			return usageError(env, "up", msg)
		}
		o.PKey = hca.PKey(k)
		for _, f := range strings.Split(*pkeyTable, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			k, msg := flagcheck.PKey("--pkey-table", f)
			if msg != "" {
				return usageError(env, "up", msg)
			}
			o.PKeyTable = append(o.PKeyTable, hca.PKey(k))
		}
		if msg := flagcheck.First(
			flagcheck.Probability("loss", *loss), flagcheck.Probability("dup", *dup),
			flagcheck.Probability("reorder", *reorder), flagcheck.Probability("delay", *delay),
			flagcheck.Duration("delay-time", *delayTime, 0),
			flagcheck.UintMax("rc-retry", *rcRetry, 7),
			flagcheck.Duration("ack-timeout", *ackTimeout, time.Millisecond),
			flagcheck.OnOff("offloads", *offloads),
		); msg != "" {
			return usageError(env, "up", msg)
		}
		o.Offloads = *offloads == "on"
		allowed, err := ParseAllow(*allow, o.Bind.Addr().Is4())
		if err != nil {
			return usageError(env, "up", "--allow: "+err.Error())
		}
		for _, l := range []struct {
			name string
			v    int
		}{{"max-rx-conns", *maxRX}, {"max-rx-conns-per-peer", *maxRXPeer}, {"max-half-open", *maxHalfOpen}} {
			if l.v < 1 {
				return usageError(env, "up", fmt.Sprintf("--%s %d: want at least 1", l.name, l.v))
			}
		}
		o.Allow, o.MaxRXConns, o.MaxRXConnsPerPeer, o.MaxHalfOpen = allowed, *maxRX, *maxRXPeer, *maxHalfOpen
		o.RCRetry, o.AckTimeout, o.UDPOffload = uint8(*rcRetry), *ackTimeout, *udpOffload
		o.Loss, o.Dup, o.Reorder, o.Delay, o.DelayTime, o.Seed = *loss, *dup, *reorder, *delay, *delayTime, *seed
		o.Host, o.ControlDir, o.Metrics = *host, *dir, *metricsAddr
		if o.Host == "" {
			o.Host = o.Dev + "@" + o.Bind.Addr().String()
		}
		if env.Euid() != 0 {
			fmt.Fprintf(env.Stderr, "ipoib up: %v: needs root (CAP_NET_ADMIN) to create TAP device %s\n", ErrSetup, o.Dev)
			return ExitUsage
		}
		o.Ready = env.upReady
		stopProfile, err := prof.start()
		if err != nil {
			return fail(env, "up", err)
		}
		err = errors.Join(runUp(ctx, o, newLogger(env.Stderr, lvl.level)), stopProfile())
		switch {
		case err == nil:
			return ExitOK
		case errors.Is(err, ErrSetup):
			fmt.Fprintf(env.Stderr, "ipoib up: %s\n", oneLine(err))
			return ExitUsage
		}
		fmt.Fprintf(env.Stderr, "ipoib up: %s\n", oneLine(err))
		return ExitFail
	}
}

// upRaw is the flag values parseUp checks.
type upRaw struct {
	dev, addr, hca, bind string
	port                 uint
	peers, mode          string
	mtu, ibMTU           int
	multicast            string
}

// parseUp validates the flags; a non-empty message is a usage error.
func parseUp(args []string, r upRaw) (UpOptions, string) {
	var o UpOptions
	if len(args) > 0 {
		return o, fmt.Sprintf("unexpected argument %q", args[0])
	}
	if msg := flagcheck.Ifname("dev", r.dev); msg != "" {
		return o, msg
	}
	if r.hca != "rocev2" {
		return o, fmt.Sprintf("--hca %q: only rocev2 is available ('ipoib fabric' runs the soft fabric)", r.hca)
	}
	pfx, err := netip.ParsePrefix(r.addr)
	if err != nil {
		return o, fmt.Sprintf("--addr %q: want an IP prefix like 10.77.0.1/24", r.addr)
	}
	bind, err := netip.ParseAddr(r.bind)
	if err != nil || bind.IsUnspecified() || bind.IsMulticast() {
		return o, fmt.Sprintf("--bind %q: want this host's unicast IP address on the link to the peers", r.bind)
	}
	bind = bind.Unmap()
	if r.port == 0 || r.port > 65535 {
		return o, fmt.Sprintf("--port %d out of range 1..65535", r.port)
	}
	var peers []netip.Addr
	for _, s := range strings.Split(r.peers, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParseAddr(s)
		if err != nil || p.Unmap().Is4() != bind.Is4() {
			return o, fmt.Sprintf("--peers: %q is not an IP address of --bind's family", s)
		}
		peers = append(peers, p.Unmap())
	}
	var mcast bool
	switch r.multicast {
	case "on":
		mcast = true
	case "off":
	default:
		return o, fmt.Sprintf("--multicast %q: want on or off", r.multicast)
	}
	if !validMode(r.mode) {
		return o, fmt.Sprintf("--mode %q: want connected or datagram", r.mode)
	}
	switch r.ibMTU {
	case 1024, 2048, 4096:
	default:
		return o, fmt.Sprintf("--ib-mtu %d: want 1024, 2048 or 4096", r.ibMTU)
	}
	if msg := flagcheck.MTU(r.mode, r.mtu, r.ibMTU); msg != "" {
		return o, msg
	}
	return UpOptions{Dev: r.dev, Addr: pfx, HCA: r.hca, Bind: netip.AddrPortFrom(bind, uint16(r.port)), Peers: peers,
		Multicast: mcast, Mode: r.mode, MTU: r.mtu, IBMTU: r.ibMTU}, ""
}

// oneLine keeps an error message on one line (joined errors print one
// per line).
func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
}
