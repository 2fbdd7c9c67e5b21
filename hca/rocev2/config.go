package rocev2

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Config configures a Device.
type Config struct {
	// Bind is the local UDP address. The address must be a specific
	// unicast address (it is the port GID and part of every ICRC); a zero
	// port means wire.RoCEv2Port.
	Bind netip.AddrPort
	// Peers are the broadcast-group members known without a subnet
	// manager. Any peer heard from (a datagram from the fabric port that
	// passed the allow list, the ICRC and P_Key checks) is added at run
	// time, up to MaxMembers.
	Peers []netip.Addr
	// Allow lists the source prefixes datagrams are accepted from;
	// others are dropped (counted not_allowed) before they are parsed.
	// The device's own address is always allowed. Empty allows every
	// source.
	Allow []netip.Prefix
	// Multicast sends UD multicast the RoCEv2 way: to the IP group
	// GroupAddr maps the MGID to, joined through the kernel by
	// AttachMcast on the interface holding Bind, so the network
	// replicates (mcast.go). Peers and hosts heard from are then no
	// replication targets. Off: head-end replication to Members.
	Multicast bool
	// Gossip spreads the replication set without multicast: members
	// exchange their member lists (membership MADs, gossip.go), so a
	// device knowing one peer comes to know every member and they it.
	// Ignored with Multicast.
	Gossip bool
	// MaxMembers bounds the broadcast group: peers, self and hosts heard
	// from. Beyond it hosts heard from are not added (counted
	// member_refused), so a flood of spoofed sources cannot turn every
	// broadcast into that many copies. 0 means DefaultMaxMembers.
	MaxMembers int
	// MTU is the path MTU, 1024..4096; 0 means 4096.
	MTU hca.MTU
	// PKeys is the P_Key table, index 0 first; empty means {0xFFFF}.
	// Device.SetPKeyTable replaces it at run time.
	PKeys []hca.PKey
	// MinAckTimeout is the floor of the transport timeout. Hardware
	// values (4.096 us * 2^Timeout, IPoIB asks for tiny ones) are far below
	// the latency of a userspace socket path; rxe's timer is likewise no
	// finer than a jiffy. 0 means 100 ms: a spurious timeout is fatal to a
	// QP with retry count 0, as IPoIB-CM uses.
	MinAckTimeout time.Duration
	// MinRetryCount raises every RC QP's transport retry count to at
	// least this (0..7, 7 = retry forever); 0 keeps what the consumer
	// asked. IPoIB-CM asks for 0, right for a lossless IB link; over UDP
	// one lost datagram would then fail the connection, since a timeout
	// and a sequence NAK each spend a retry. The CM cannot see this
	// floor, so a REQ then announces a count the QP does not use; ipoib
	// up asks for its count through the CM instead (ipoibcm RCRetry).
	MinRetryCount uint8
	// TimeScale multiplies the transport timeout (4.096 us * 2^Timeout)
	// and the RNR timer so tests can run the real code in milliseconds;
	// 0 means 1.
	TimeScale float64
	// Faults injects UDP-layer faults on transmit. While any fault is
	// on, datagrams leave one per message (no GSO).
	Faults Faults
	// DisableGSO sends one datagram per message instead of grouping a
	// run of equal-sized datagrams to one peer into one UDP_SEGMENT
	// message; DisableGRO keeps UDP_GRO off, so every receive buffer is
	// one datagram. Both offloads are used only where the kernel has
	// them; the switches exist to measure and test the plain paths.
	DisableGSO, DisableGRO bool
	// UDPReceive (IPv4) reads datagrams from the UDP socket instead of a
	// packet socket. A UDP socket hides the IPv4 ID the ICRC covers, so
	// it accepts only the IDs this backend's own senders use (0..63,
	// docs/wire.md §4.6); a packet socket sees the ID and accepts any
	// RoCEv2 sender, but needs CAP_NET_RAW: without it the device falls
	// back to the UDP socket and says so in its log. IPv6 always uses
	// the UDP socket (no ID).
	UDPReceive bool
	// NoOffloads makes the device report no checksum offload and no UD
	// LSO (and skip verifying received checksums), as an HCA without
	// them.
	NoOffloads bool
	// Logger receives debug logs; nil discards them.
	Logger *slog.Logger
	// Name names the device; empty means "rocev2:<bind>".
	Name string
	// Tap, if set, sees every packet the device sends (before GSO groups
	// them) and every packet it accepts (after GRO is split, once the
	// ICRC verified): ipoib capture.
	Tap Tap
}

// Tap sees RoCEv2 packets as UDP payloads (BTH to ICRC) with the UDP
// endpoints they travel between. Datagram runs under the device lock: it
// must copy pkt to keep it, and return quickly.
type Tap interface {
	Datagram(src, dst netip.AddrPort, pkt []byte)
}

// IdleTap is a Tap that can say nobody is looking (a capture mux with no
// capture attached). While Idle reports true the device sends without
// copying payloads; a tapped packet must be one piece, so it is copied.
type IdleTap interface {
	Tap
	Idle() bool
}

func (c *Config) normalize() error {
	if !c.Bind.Addr().IsValid() || c.Bind.Addr().IsUnspecified() {
		return fmt.Errorf("rocev2: bind address %v must be a specific address: %w", c.Bind, hca.ErrInvalidArgument)
	}
	if c.Bind.Port() == 0 {
		c.Bind = netip.AddrPortFrom(c.Bind.Addr(), wire.RoCEv2Port)
	}
	c.Bind = netip.AddrPortFrom(c.Bind.Addr().Unmap(), c.Bind.Port())
	if c.MTU == 0 {
		c.MTU = hca.MTU4096
	}
	allow, err := normalizeAllow(c.Allow)
	if err != nil {
		return err
	}
	c.Allow = allow
	if c.MaxMembers <= 0 {
		c.MaxMembers = DefaultMaxMembers
	}
	if !c.MTU.Valid() || c.MTU < hca.MTU1024 {
		return fmt.Errorf("rocev2: MTU %d not in 1024..4096: %w", c.MTU, hca.ErrInvalidArgument)
	}
	if len(c.PKeys) == 0 {
		c.PKeys = []hca.PKey{hca.PKeyDefault}
	}
	c.PKeys = append([]hca.PKey(nil), c.PKeys...)
	if c.MinAckTimeout <= 0 {
		c.MinAckTimeout = 100 * time.Millisecond
	}
	if c.MinRetryCount > 7 {
		return fmt.Errorf("rocev2: minimum retry count %d not in 0..7: %w", c.MinRetryCount, hca.ErrInvalidArgument)
	}
	if c.TimeScale <= 0 {
		c.TimeScale = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Name == "" {
		c.Name = "rocev2:" + c.Bind.String()
	}
	if err := c.Faults.normalize(); err != nil {
		return fmt.Errorf("rocev2: %w: %w", err, hca.ErrInvalidArgument)
	}
	return nil
}

// DefaultMaxMembers bounds the broadcast group: a large IPoIB subnet,
// with room for the peers configured.
const DefaultMaxMembers = 1024

// rnrTimerTable is the IBTA RNR NAK timer encoding (Vol 1 table 45), in
// microseconds; code 0 is the longest, 655.36 ms.
var rnrTimerTable = [32]time.Duration{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// RNRTimer returns the RNR NAK delay of an IBTA timer code.
func RNRTimer(code uint8) time.Duration { return rnrTimerTable[code&31] * time.Microsecond }

// TransportTimeout returns 4.096 us * 2^t, the local ACK timeout; 0 for
// t == 0, which means no timeout.
func TransportTimeout(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	return time.Duration(4096<<min(t, 31)) * time.Nanosecond
}

func (c *Config) scale(d time.Duration) time.Duration {
	s := time.Duration(float64(d) * c.TimeScale)
	return max(s, time.Microsecond)
}

// normalizeAllow checks an allow list and puts it in the form sources
// are compared in.
func normalizeAllow(in []netip.Prefix) ([]netip.Prefix, error) {
	allow := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if !p.IsValid() {
			return nil, fmt.Errorf("rocev2: allow prefix %v: %w", p, hca.ErrInvalidArgument)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			// Sources arrive unmapped: ::ffff:a.b.c.d/n is a.b.c.d/(n-96).
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		allow = append(allow, p.Masked())
	}
	return allow, nil
}
