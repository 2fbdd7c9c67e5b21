package ipoibcm

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
)

// Mode is the IPoIB transport mode of an Interface: whether it initiates
// RC connections (connected) or sends unicast over the UD QP (datagram).
// In both modes the Interface accepts connections, as Linux does.
//
//go:generate go tool stringer -type=Mode -linecomment
type Mode int

// The two modes; the names are the strings Linux's sysfs "mode" file uses.
const (
	ModeDatagram  Mode = iota // datagram
	ModeConnected             // connected
)

// ErrInvalidMode is wrapped by ParseMode and SetMode.
var ErrInvalidMode = errors.New("invalid IPoIB mode")

// ParseMode parses "datagram" or "connected" (surrounding space and a
// trailing newline are ignored, like a write to Linux's sysfs file).
func ParseMode(s string) (Mode, error) {
	switch strings.TrimSpace(s) {
	case "datagram":
		return ModeDatagram, nil
	case "connected":
		return ModeConnected, nil
	}
	return 0, fmt.Errorf("parse mode %q: %w", s, ErrInvalidMode)
}

// Defaults for zero Config fields. Queue sizes and the stale-reaper times
// are Linux's (docs/linux.md §1).
const (
	DefaultSendQueueSize = 128
	DefaultRecvQueueSize = 256
	// DefaultMaxRecvQueueSize bounds the SRQ's growth under load (srq.go
	// says why it grows): 2048 buffers of 64 KiB, 128 MiB, hold what
	// sixteen TCP streams keep in flight with Linux's default tcp_rmem.
	// Linux's recv_queue_size goes up to 8192 (IPOIB_MAX_QUEUE_SIZE).
	DefaultMaxRecvQueueSize = 2048
	// DefaultUDRecvQueueSize is the UD receive ring, 16x Linux's 256: UD
	// has no flow control, and a userspace receiver that hands every
	// packet to the host with a write(2) (the host's TCP receive runs in
	// that call) drains its ring several times slower than the peer's
	// reader fills it with read(2)s, so a stalled receiver must hold the
	// sender's whole window. A Linux sender's window is bounded in bytes
	// (tcp_wmem, 4 MiB: about 2 MB of segments in flight), the ring in
	// packets: at MTU 4092 that window is ~520 datagrams, at 2000 ~1100,
	// at 1280 ~1700 (measured with ss). 1024 held it only down to ~2100
	// and TCP retransmitted hundreds of segments a second below that;
	// 4096 holds it down to the IPv6 minimum MTU, 1280
	// (TestBinaryDatagramLoweredMTUNoLoss). The buffers are IB-MTU sized
	// whatever the host MTU, ~17 MB per interface, touched only as used.
	DefaultUDRecvQueueSize = 4096
	DefaultMaxNonSRQConns  = 128
	// DefaultMaxRXConns: one passive connection per peer of a 1024-host
	// subnet, plus the same again in teardown or restart.
	DefaultMaxRXConns = 2048
	// DefaultMaxRXConnsPerGID: a peer has one TX connection to us; a
	// restart adds one until the old goes stale, and a few more cover a
	// peer restarting repeatedly.
	DefaultMaxRXConnsPerGID = 4
	DefaultRXBudget         = 64
	DefaultTXBudget         = 64

	// DefaultCMBackoff is how long a peer that advertises 'C' but rejects
	// or never answers a REQ is reached over UD. Linux retries CM on the
	// next packet forever (docs/linux.md §10 row 11), so such a peer costs
	// one CM timeout (~4 s of stalled traffic) per neighbour rebuild. A
	// minute keeps that cost below 10% of the time while still noticing a
	// peer that fixed itself within a neighbour lifetime.
	DefaultCMBackoff = 60 * time.Second

	DefaultStaleUpdate = 256 * time.Second // IPOIB_CM_RX_UPDATE_TIME
	DefaultStaleAfter  = 512 * time.Second // IPOIB_CM_RX_TIMEOUT
	DefaultStaleScan   = 768 * time.Second // IPOIB_CM_RX_DELAY

	// DefaultNeighbourTimeout is 2 * the ARP gc_interval of 30 s: the
	// lower bound of when Linux frees an unused IPoIB neighbour.
	DefaultNeighbourTimeout = 60 * time.Second

	// neighbourEvictFactor: a neighbour silent for this many
	// NeighbourTimeouts (10 min by default) is forgotten; see
	// Config.NeighbourEvictAfter.
	neighbourEvictFactor = 10

	// DefaultMaxMcastGroups bounds the multicast groups an interface
	// keeps for its host, full and send-only (mcast.go): well above what
	// hosts join (a few per address and service), low enough that a host
	// sending to every group it can name costs at most this many address
	// handles.
	DefaultMaxMcastGroups = 1024

	// DefaultDrainTimeout is ipoib_cm_dev_stop's 5 s bound.
	DefaultDrainTimeout = 5 * time.Second

	// maxParked is IPOIB_MAX_PATH_REC_QUEUE.
	maxParked = 3
)

// Config configures an Interface.
type Config struct {
	// Device is the HCA; the Interface uses its single port.
	Device hca.Device
	// Host is the host side. The Interface owns it: Close closes it.
	Host HostPort
	// Name names the interface in logs and statistics (e.g. "ib0").
	Name string

	// Mode is the initial mode.
	Mode Mode
	// MTU is the IP MTU; 0 = mode default (65520 connected, UD MTU
	// datagram). In datagram mode it is capped at the UD MTU.
	MTU int
	// PKey is the interface's partition (default 0xFFFF), as Linux's
	// priv->pkey: its MGIDs carry it with the full-member bit, and every
	// QP (UD, and both sides of every RC connection) uses the index of
	// its entry in the port's table, whose value (the membership the
	// subnet manager gave the port) is what the BTH and the CM REQ
	// carry. 0x0000 and 0x8000 are invalid.
	PKey hca.PKey
	// DisableCM makes the Interface a datagram-only node: its hardware
	// address carries no 'C' flag, it does not listen and never connects.
	DisableCM bool

	SendQueueSize int // send credits and per-QP send queue depth (128)
	RecvQueueSize int // SRQ and per-connection ring depth (256)
	// MaxRecvQueueSize is how far the SRQ may grow under load
	// (DefaultMaxRecvQueueSize, or RecvQueueSize if that is larger);
	// RecvQueueSize keeps it at Linux's fixed size.
	MaxRecvQueueSize int
	// UDRecvQueueSize is the UD ring depth; 0 means RecvQueueSize if that
	// was set, else DefaultUDRecvQueueSize.
	UDRecvQueueSize int
	DisableSRQ      bool
	MaxNonSRQConns  int // passive connections without SRQ (128)
	// MaxRXConns bounds the passive connections, with or without SRQ,
	// from REQ to reaped (DefaultMaxRXConns); MaxRXConnsPerGID bounds
	// them per remote GID (DefaultMaxRXConnsPerGID). REQs over either
	// are rejected NO_QP, unless the GID holds an established
	// connection, which is then replaced (rxlimit.go).
	MaxRXConns       int
	MaxRXConnsPerGID int

	RXBudget int // completions per RX poll (64)
	TXBudget int // completions per TX poll (64)
	// InlineRX polls the RX CQ on the goroutine whose verb call produced
	// the completion whenever no poll is running (napi.Config.Inline), as
	// a softirq runs NAPI where the interrupt was raised. On a backend
	// that delivers completion events inline (hca/soft) the sender, the
	// peer's host reader, then writes the frame to this host itself: no
	// wake-up of the RX poller, and the data stays on one core. A batch
	// arriving while the neighbour table's lock is held (by the RX poller
	// or a control path) goes to the RX poller. Off by default: a backend that raises completion
	// events on goroutines of its own (hca/rocev2) would write to the host
	// from those.
	InlineRX bool

	// CM configures the connection manager the Interface creates.
	CM cm.Options
	// CMManager, if set, is the device's connection manager the Interface
	// uses instead of creating one (CM is then ignored): a device has one
	// GSI QP, so the interfaces of one device (a parent and its P_Key
	// children) share one Manager. The Interface listens on it in its own
	// partition and never closes it.
	CMManager *cm.Manager
	// RCRetry is the transport retry count of the REQ, and so of both
	// QPs of every connection (0..7, 7 = forever). 0, the default, is
	// ipoib_cm_send_req's "RFC draft warns against retries"; a lossy
	// underlay wants more.
	RCRetry uint8

	// CMBackoff: see DefaultCMBackoff.
	CMBackoff time.Duration
	// StaleUpdate, StaleAfter, StaleScan drive the passive LRU: a stamp
	// refreshed at most every StaleUpdate, connections idle longer than
	// StaleAfter reaped by a scan every StaleScan.
	StaleUpdate, StaleAfter, StaleScan time.Duration
	// NeighbourTimeout ages neighbours unused for sending; their TX
	// connection is disconnected.
	NeighbourTimeout time.Duration
	// NeighbourEvictAfter forgets a neighbour nothing was sent to or heard
	// from for this long, with no connection either way and no parked
	// frame, so the table stays bounded by the recently active peers.
	// Default 10 * NeighbourTimeout: well past the host's ARP/ND cache
	// staleness (Linux: 30-60 s), so the host no longer trusts the MAC it
	// knew the neighbour by. Must not be below NeighbourTimeout.
	NeighbourEvictAfter time.Duration
	// DrainTimeout bounds the wait for the drain protocol at Close.
	DrainTimeout time.Duration
	// MaxMcastGroups bounds the host's multicast groups (full and
	// send-only; the default groups not counted), DefaultMaxMcastGroups.
	// A join over it first evicts the least recently used send-only
	// group; a send to a new group over it is dropped
	// (tx_mcast_table_full).
	MaxMcastGroups int
	// McastSendOnlyTimeout ages out a send-only group the host has not
	// sent to for this long; default NeighbourTimeout, as Linux collects
	// send-only groups with the neighbours.
	McastSendOnlyTimeout time.Duration

	Logger *slog.Logger

	// Events, if set, is told of every connection lifecycle event (see
	// EventObserver): ipoib capture and the metrics use it.
	Events EventObserver
}

func (c Config) withDefaults() (Config, error) {
	if c.Device == nil {
		return c, fmt.Errorf("ipoibcm config: Device is nil: %w", hca.ErrInvalidArgument)
	}
	if c.Host == nil {
		return c, fmt.Errorf("ipoibcm config: Host is nil: %w", hca.ErrInvalidArgument)
	}
	if c.Mode != ModeDatagram && c.Mode != ModeConnected {
		return c, fmt.Errorf("ipoibcm config: %w: %d", ErrInvalidMode, int(c.Mode))
	}
	if c.DisableCM && c.Mode == ModeConnected {
		return c, fmt.Errorf("ipoibcm config: connected mode with CM disabled: %w", ErrInvalidMode)
	}
	if c.Name == "" {
		c.Name = "ib0"
	}
	if c.PKey == 0 {
		c.PKey = hca.PKeyDefault
	}
	if !c.PKey.Valid() {
		return c, fmt.Errorf("ipoibcm config: P_Key %#04x: %w", uint16(c.PKey), hca.ErrInvalidArgument)
	}
	setDefault(&c.SendQueueSize, DefaultSendQueueSize)
	if c.UDRecvQueueSize <= 0 {
		c.UDRecvQueueSize = c.RecvQueueSize
		if c.UDRecvQueueSize <= 0 {
			c.UDRecvQueueSize = DefaultUDRecvQueueSize
		}
	}
	setDefault(&c.RecvQueueSize, DefaultRecvQueueSize)
	setDefault(&c.MaxRecvQueueSize, max(DefaultMaxRecvQueueSize, c.RecvQueueSize))
	if c.MaxRecvQueueSize < c.RecvQueueSize {
		return c, fmt.Errorf("ipoibcm config: largest SRQ %d below its first size %d: %w",
			c.MaxRecvQueueSize, c.RecvQueueSize, hca.ErrInvalidArgument)
	}
	setDefault(&c.MaxNonSRQConns, DefaultMaxNonSRQConns)
	setDefault(&c.MaxRXConns, DefaultMaxRXConns)
	setDefault(&c.MaxRXConnsPerGID, DefaultMaxRXConnsPerGID)
	setDefault(&c.RXBudget, DefaultRXBudget)
	setDefault(&c.TXBudget, DefaultTXBudget)
	setDefault(&c.CMBackoff, DefaultCMBackoff)
	setDefault(&c.StaleUpdate, DefaultStaleUpdate)
	setDefault(&c.StaleAfter, DefaultStaleAfter)
	setDefault(&c.StaleScan, DefaultStaleScan)
	setDefault(&c.NeighbourTimeout, DefaultNeighbourTimeout)
	setDefault(&c.NeighbourEvictAfter, neighbourEvictFactor*c.NeighbourTimeout)
	if c.NeighbourEvictAfter < c.NeighbourTimeout {
		return c, fmt.Errorf("ipoibcm config: NeighbourEvictAfter %v below NeighbourTimeout %v: %w",
			c.NeighbourEvictAfter, c.NeighbourTimeout, hca.ErrInvalidArgument)
	}
	setDefault(&c.DrainTimeout, DefaultDrainTimeout)
	setDefault(&c.MaxMcastGroups, DefaultMaxMcastGroups)
	setDefault(&c.McastSendOnlyTimeout, c.NeighbourTimeout)
	if c.RCRetry > 7 {
		return c, fmt.Errorf("ipoibcm config: RC retry count %d not in 0..7: %w", c.RCRetry, hca.ErrInvalidArgument)
	}
	if c.SendQueueSize < 4 || c.RecvQueueSize < 4 || c.UDRecvQueueSize < 4 {
		return c, fmt.Errorf("ipoibcm config: queue sizes %d/%d/%d below 4: %w",
			c.SendQueueSize, c.RecvQueueSize, c.UDRecvQueueSize, hca.ErrInvalidArgument)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
