package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/cmd/ipoib/internal/config"
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
	"github.com/ipoibcm/ipoib/ipoibcm"
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
	// RecvQueueSize is the SRQ's first size and RecvQueueMax how far its
	// limit event may double it (ipoibcm.Config's RecvQueueSize and
	// MaxRecvQueueSize).
	RecvQueueSize, RecvQueueMax int
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
	// Queues is the TAP's queue count (--queues; IFF_MULTI_QUEUE above 1).
	Queues int
	// Host names the interface on the control socket.
	Host       string
	ControlDir string
	// Metrics, if set, is the address of the Prometheus endpoint.
	Metrics string
	// LogLevel is the level --log-level asks for.
	LogLevel slog.Level
	// ConfigPath is the --config file, Children its [[child]] tables,
	// created once the interface runs.
	ConfigPath string
	Children   []config.Child
	// Ready, if set, is called once the control socket serves.
	Ready func(controlPath string)

	// What the running process adds: reload resolves the options again
	// (nil: nothing to reload), hangup delivers SIGHUP, notify is the
	// service manager's socket, level the logger's level.
	reload func() (UpOptions, error)
	hangup <-chan os.Signal
	notify string
	level  *slog.LevelVar
}

// upFlagSet is the flags of 'ipoib up', declared on one FlagSet. A
// reload declares them again on a fresh one, so the values of the file
// and of the command line are resolved exactly as at the start.
type upFlagSet struct {
	fs                            *flag.FlagSet
	dev, addr, hcaName, bind      *string
	port                          *uint
	peers, multicast, allow       *string
	maxRX, maxRXPeer, maxHalfOpen *int
	recvQueue, recvQueueMax       *int
	pkey, pkeyTable               *string
	ibMTU                         *int
	loss, dup, reorder, delay     *float64
	delayTime                     *time.Duration
	seed                          *uint64
	rcRetry                       *uint
	ackTimeout                    *time.Duration
	udpOffload                    *bool
	host, dir, config             *string
	ib                            *ibFlags
	prof                          *profileFlags
}

func declareUpFlags(fs *flag.FlagSet, env *Env) *upFlagSet {
	u := &upFlagSet{fs: fs}
	u.config = fs.String("config", "", "read the settings from this TOML file (keys: the flag names; [[child]] tables: P_Key children); flags given override it; SIGHUP or 'ipoib reload' re-reads it")
	u.dev = fs.String("dev", "ib0", "TAP device name")
	u.addr = fs.String("addr", "", "IP prefix of the device, e.g. 10.77.0.1/24 (required)")
	u.hcaName = fs.String("hca", "rocev2", "HCA backend: rocev2")
	u.bind = fs.String("bind", "", "local IP address for RoCEv2/UDP, e.g. 192.0.2.1 (required; its GID is ::ffff:<addr>)")
	u.port = fs.Uint("port", 4791, "UDP port of the fabric (every host uses the same)")
	u.peers = fs.String("peers", "", "comma-separated IP addresses of other hosts: with --multicast=off the seeds of head-end replication (members they know, and hosts heard from inside --allow, join too, up to 1024); optional with --multicast=on")
	u.multicast = fs.String("multicast", "on", "on: multicast UD goes to the IP group of its MGID and the network replicates (needs IGMP/MLD multicast on the link); off: head-end replication, one unicast copy per member")
	u.allow = fs.String("allow", "", "comma-separated underlay source prefixes to accept, or 'any'; others are dropped before parsing (default: --peers and the subnet --bind is on)")
	u.maxRX = fs.Int("max-rx-conns", 2048, "passive connections at most (REQs over it get REJ NO_QP); a peer holding an established one may replace it")
	u.maxRXPeer = fs.Int("max-rx-conns-per-peer", 4, "passive connections from one peer GID at most")
	u.recvQueue = fs.Int("recv-queue-size", ipoibcm.DefaultRecvQueueSize, "receive buffers of 64 KiB on the SRQ at start, as Linux's ib_ipoib recv_queue_size (4..8192)")
	u.recvQueueMax = fs.Int("recv-queue-max", ipoibcm.DefaultMaxRecvQueueSize, "the SRQ doubles under load up to this many buffers (--recv-queue-size..8192; equal to it keeps the SRQ fixed, as Linux's)")
	u.maxHalfOpen = fs.Int("max-half-open", 256, "passive handshakes awaiting the peer's RTU at most; a REQ beyond evicts one of the source holding the most")
	u.pkey = fs.String("pkey", "0xffff", "partition of the device: its P_Key (0x8001); no subnet manager runs, so the port's P_Key table is {0xffff, this}, bit 15 clear making the port a limited member (0x0001)")
	u.pkeyTable = fs.String("pkey-table", "", "more comma-separated P_Keys for the port's table, the partitions 'ipoib child add' may use here (bit 15 the membership, as --pkey)")
	u.ibMTU = fs.Int("ib-mtu", 4096, "IB path MTU: 1024, 2048 or 4096 (the UDP path must carry it plus 60 bytes)")
	u.loss = fs.Float64("loss", 0, "fault injection: probability of dropping an outgoing UDP datagram")
	u.dup = fs.Float64("dup", 0, "fault injection: probability of sending a datagram twice")
	u.reorder = fs.Float64("reorder", 0, "fault injection: probability of swapping a datagram with the next")
	u.delay = fs.Float64("delay", 0, "fault injection: probability of holding a datagram back by --delay-time")
	u.delayTime = fs.Duration("delay-time", time.Millisecond, "fault injection: how long --delay holds a datagram")
	u.seed = fs.Uint64("seed", 1, "fault injection random seed")
	u.rcRetry = fs.Uint("rc-retry", 6, "RC transport retry count the CM REQ asks for and both QPs use (0..7, 7 = forever): Linux IPoIB-CM asks for 0, which one lost UDP datagram would turn into a dropped connection")
	u.ackTimeout = fs.Duration("ack-timeout", 50*time.Millisecond, "RC transport (ACK) timeout at least: the go-back-N retransmit delay when a datagram is lost")
	u.udpOffload = fs.Bool("udp-offload", true, "use UDP GSO/GRO on the RoCEv2 socket where the kernel has them (false: one datagram per send and receive)")
	u.host = fs.String("host", "", "name on the control socket (ipoib show/mode --host); default <dev>@<bind>")
	u.ib = declareIBFlags(fs, "the device", "the TAP")
	u.dir = controlDirFlag(fs, env)
	u.prof = addProfileFlags(fs)
	return u
}

func upFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	u := declareUpFlags(fs, env)
	return func(ctx context.Context, args []string) int {
		cmdline := setFlags(fs)
		o, err := resolveUp(u, args, cmdline)
		if err != nil {
			return resolveError(env, "up", err)
		}
		if env.Euid() != 0 {
			return refuse(env, "up", fmt.Sprintf("%v: needs root (CAP_NET_ADMIN) to create TAP device %s", ErrSetup, o.Dev))
		}
		o.Ready = env.upReady
		o.reload = func() (UpOptions, error) { return reloadUp(env, cmdline) }
		o.hangup = env.Hangup
		o.notify = env.NotifySocket
		level := new(slog.LevelVar)
		level.Set(o.LogLevel)
		o.level = level
		stopProfile, err := u.prof.start()
		if err != nil {
			return fail(env, "up", err)
		}
		err = errors.Join(runUp(ctx, o, newLeveledLogger(env, level)), stopProfile())
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

// setFlags are the flags given on the command line, by name, with their
// values as flag.Value spells them.
func setFlags(fs *flag.FlagSet) map[string]string {
	m := map[string]string{}
	fs.Visit(func(f *flag.Flag) { m[f.Name] = f.Value.String() })
	return m
}

// reloadUp resolves 'ipoib up' again as at its start: the file re-read,
// the command line's flags over it.
func reloadUp(env *Env, cmdline map[string]string) (UpOptions, error) {
	fs := flag.NewFlagSet("ipoib up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	u := declareUpFlags(fs, env)
	for name, v := range cmdline {
		if err := fs.Set(name, v); err != nil {
			return UpOptions{}, fmt.Errorf("--%s: %w", name, err)
		}
	}
	return resolveUp(u, nil, cmdline)
}

// resolveUp applies the config file (if --config names one) under the
// command line's flags and checks the result; a failure is one line
// naming the flag, or the file, line and key.
func resolveUp(u *upFlagSet, args []string, cmdline map[string]string) (UpOptions, error) {
	var file *config.File
	if *u.config != "" {
		f, err := config.Load(*u.config, upSchema(u.fs))
		if err != nil {
			return UpOptions{}, err
		}
		for _, s := range f.Settings {
			if _, given := cmdline[s.Key]; given {
				continue
			}
			if err := u.fs.Set(s.Key, s.Value); err != nil {
				return UpOptions{}, &config.Error{Path: f.Path, Line: s.Line, Key: s.Key, Msg: fmt.Sprintf("%q: %v", s.Value, err)}
			}
		}
		for _, key := range []string{"addr", "bind"} {
			_, inFile := f.Setting(key)
			if _, given := cmdline[key]; !inFile && !given {
				return UpOptions{}, &config.Error{Path: f.Path, Line: 1, Key: key, Msg: fmt.Sprintf("missing required key (or give --%s)", key)}
			}
		}
		file = f
	}
	o, msg := u.options(args)
	if msg != "" {
		return UpOptions{}, attribute(msg, file, cmdline)
	}
	if file != nil {
		o.ConfigPath = file.Path
		kids, err := upChildren(o, file)
		if err != nil {
			return UpOptions{}, err
		}
		o.Children = kids
	}
	return o, nil
}

// attribute turns a flag's message ("--addr ...") into the file's
// ("ib0.conf:3: addr ...") when the value came from the file.
func attribute(msg string, f *config.File, cmdline map[string]string) error {
	name, ok := strings.CutPrefix(msg, "--")
	if f == nil || !ok {
		return errors.New(msg)
	}
	if i := strings.IndexAny(name, " :="); i >= 0 {
		name = name[:i]
	}
	s, inFile := f.Setting(name)
	if _, given := cmdline[name]; given || !inFile {
		return errors.New(msg)
	}
	return &config.Error{Path: f.Path, Line: s.Line, Key: name, Msg: strings.TrimLeft(strings.TrimPrefix(msg, "--"+name), " :")}
}

// resolveError reports a failed resolveUp: a file's error as it is (it
// names file, line and key), a flag's as a usage error; status 2 both.
func resolveError(env *Env, cmd string, err error) int {
	var ce *config.Error
	if errors.As(err, &ce) || strings.HasPrefix(err.Error(), "config: ") {
		fmt.Fprintf(env.Stderr, "ipoib %s: %s\n", cmd, oneLine(err))
		return ExitUsage
	}
	return usageError(env, cmd, err.Error())
}

// upSchema is the keys a config file may have: every flag of up but
// --config, its kind taken from the flag's value.
func upSchema(fs *flag.FlagSet) config.Schema {
	s := config.Schema{}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		kind := config.String
		if g, ok := f.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case bool:
				kind = config.Bool
			case int, int64:
				kind = config.Int
			case uint, uint64:
				kind = config.Uint
			case float64:
				kind = config.Float
			case time.Duration:
				kind = config.Duration
			}
		}
		if upListFlags[f.Name] {
			kind = config.List
		}
		s[f.Name] = kind
	})
	return s
}

// upListFlags are the comma-separated flags, an array in the file.
var upListFlags = map[string]bool{"peers": true, "allow": true, "pkey-table": true}

// upChildren checks the file's children against the port they will be
// made on: a partition in its P_Key table, not the device's own, names
// that do not clash.
func upChildren(o UpOptions, f *config.File) ([]config.Child, error) {
	table := upPKeyTable(o.PKey, o.PKeyTable)
	own := upPartition(o.PKey)
	names := map[string]int{o.Dev: 0}
	var out []config.Child
	for i, c := range f.Children {
		at := func(key, msg string, args ...any) error {
			return &config.Error{Path: f.Path, Line: c.Line, Key: fmt.Sprintf("%s[%d]%s", config.ChildKey, i+1, key), Msg: fmt.Sprintf(msg, args...)}
		}
		full := hca.PKey(c.PKey) | 0x8000
		if full == own {
			return nil, at(".pkey", "partition 0x%04x is %s's own (pkey)", uint16(full), o.Dev)
		}
		if !slices.ContainsFunc(table, func(k hca.PKey) bool { return k&0x7FFF == full&0x7FFF }) {
			return nil, at(".pkey", "partition 0x%04x is not in the port's P_Key table: add it to pkey-table", uint16(full))
		}
		if c.Name == "" {
			c.Name = childName(o.Dev, c.PKey)
		}
		if line, dup := names[c.Name]; dup {
			if line == 0 {
				return nil, at(".name", "%s is the device's own name", c.Name)
			}
			return nil, at(".name", "%s is also the child at line %d", c.Name, line)
		}
		names[c.Name] = c.Line
		out = append(out, c)
	}
	return out, nil
}

// options validates the flag values in one table of rules, each filling
// in what it parsed; a non-empty message is a usage error naming the
// flag.
func (u *upFlagSet) options(args []string) (UpOptions, string) {
	o := UpOptions{Dev: *u.dev, HCA: *u.hcaName, IBMTU: *u.ibMTU}
	rules := []rule{
		noArgs(args),
		check(flagcheck.Ifname("dev", *u.dev)),
		func() string {
			if *u.hcaName != "rocev2" {
				return fmt.Sprintf("--hca %q: only rocev2 is available ('ipoib fabric' runs the soft fabric)", *u.hcaName)
			}
			return ""
		},
		func() string {
			var err error
			if *u.addr == "" {
				return "--addr is required: the device's IP prefix, e.g. 10.77.0.1/24"
			}
			if o.Addr, err = netip.ParsePrefix(*u.addr); err != nil {
				return fmt.Sprintf("--addr %q: want an IP prefix like 10.77.0.1/24", *u.addr)
			}
			return ""
		},
		func() string {
			if *u.bind == "" {
				return "--bind is required: this host's IP address on the link to the peers, e.g. 192.0.2.1"
			}
			bind, err := netip.ParseAddr(*u.bind)
			if err != nil || bind.IsUnspecified() || bind.IsMulticast() {
				return fmt.Sprintf("--bind %q: want this host's unicast IP address on the link to the peers", *u.bind)
			}
			if *u.port == 0 || *u.port > 65535 {
				return fmt.Sprintf("--port %d out of range 1..65535", *u.port)
			}
			o.Bind = netip.AddrPortFrom(bind.Unmap(), uint16(*u.port))
			return ""
		},
		func() string {
			for _, s := range strings.Split(*u.peers, ",") {
				if s = strings.TrimSpace(s); s == "" {
					continue
				}
				p, err := netip.ParseAddr(s)
				if err != nil || p.Unmap().Is4() != o.Bind.Addr().Is4() {
					return fmt.Sprintf("--peers: %q is not an IP address of --bind's family", s)
				}
				o.Peers = append(o.Peers, p.Unmap())
			}
			return ""
		},
		oneOf("multicast", *u.multicast, "on", "off"),
		func() string {
			switch *u.ibMTU {
			case 1024, 2048, 4096:
				return ""
			}
			return fmt.Sprintf("--ib-mtu %d: want 1024, 2048 or 4096", *u.ibMTU)
		},
	}
	rules = append(rules, u.ib.rules(func() int { return *u.ibMTU })...)
	rules = append(rules,
		func() string {
			k, msg := flagcheck.PKey("--pkey", *u.pkey)
			o.PKey = hca.PKey(k)
			return msg
		},
		func() string {
			for _, f := range strings.Split(*u.pkeyTable, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				k, msg := flagcheck.PKey("--pkey-table", f)
				if msg != "" {
					return msg
				}
				o.PKeyTable = append(o.PKeyTable, hca.PKey(k))
			}
			return ""
		},
		check(flagcheck.Probability("loss", *u.loss)), check(flagcheck.Probability("dup", *u.dup)),
		check(flagcheck.Probability("reorder", *u.reorder)), check(flagcheck.Probability("delay", *u.delay)),
		check(flagcheck.Duration("delay-time", *u.delayTime, 0)),
		check(flagcheck.UintMax("rc-retry", *u.rcRetry, 7)),
		check(flagcheck.Duration("ack-timeout", *u.ackTimeout, time.Millisecond)),
		func() string {
			allowed, err := ParseAllow(*u.allow, o.Bind.Addr().Is4())
			if err != nil {
				return "--allow: " + err.Error()
			}
			o.Allow = allowed
			return ""
		},
		atLeastOne("max-rx-conns", *u.maxRX), atLeastOne("max-rx-conns-per-peer", *u.maxRXPeer), atLeastOne("max-half-open", *u.maxHalfOpen),
		check(flagcheck.IntRange("recv-queue-size", *u.recvQueue, 4, maxRecvQueue)),
		check(flagcheck.IntRange("recv-queue-max", *u.recvQueueMax, *u.recvQueue, maxRecvQueue)),
	)
	if msg := firstBroken(append(rules, u.prof.rules()...)...); msg != "" {
		return o, msg
	}
	o.Mode, o.MTU, o.Offloads, o.Queues = *u.ib.mode, *u.ib.mtu, *u.ib.offloads == "on", *u.ib.queues
	o.Multicast = *u.multicast == "on"
	o.MaxRXConns, o.MaxRXConnsPerPeer, o.MaxHalfOpen = *u.maxRX, *u.maxRXPeer, *u.maxHalfOpen
	o.RecvQueueSize, o.RecvQueueMax = *u.recvQueue, *u.recvQueueMax
	o.RCRetry, o.AckTimeout, o.UDPOffload = uint8(*u.rcRetry), *u.ackTimeout, *u.udpOffload
	o.Loss, o.Dup, o.Reorder, o.Delay, o.DelayTime, o.Seed = *u.loss, *u.dup, *u.reorder, *u.delay, *u.delayTime, *u.seed
	o.Host, o.ControlDir, o.Metrics, o.LogLevel = *u.host, *u.dir, *u.ib.metrics, u.ib.lvl.level
	if o.Host == "" {
		o.Host = o.Dev + "@" + o.Bind.Addr().String()
	}
	return o, ""
}

// maxRecvQueue is Linux's largest recv_queue_size (IPOIB_MAX_QUEUE_SIZE).
const maxRecvQueue = 8192

// atLeastOne checks a limit flag.
func atLeastOne(flagName string, v int) rule {
	return func() string {
		if v < 1 {
			return fmt.Sprintf("--%s %d: want at least 1", flagName, v)
		}
		return ""
	}
}

// oneLine keeps an error message on one line (joined errors print one
// per line).
func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
}
