package netstack

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Defaults applied by New to zero fields of Config.
const (
	DefaultMTU       = 1500
	DefaultQueueLen  = 4096
	DefaultBatchSize = 64

	// DefaultCongestionControl is CUBIC: on a lossless in-memory link it and
	// Reno are equal, but behind the engine the queue toward ib0 drops under
	// overload and CUBIC regains the window faster at high bandwidth-delay
	// products. gVisor has fixed the RACK coarse-clock problem that made
	// Tailscale pin Reno with RACK off, so RACK stays on.
	DefaultCongestionControl = "cubic"

	// DefaultBufferDefault and DefaultBufferMax size TCP send and receive
	// buffers. Both are 8 MiB: starting smaller and letting receive-buffer
	// moderation grow the window made gVisor stall about one run in two at
	// MTU 65520 (a 200 ms retransmission timeout with no packet lost,
	// throughput 10 -> 2 Gbit/s); starting at the maximum never did in the
	// same measurements.
	DefaultBufferDefault = 8 << 20
	DefaultBufferMax     = 8 << 20

	// maxFrameSize is the largest Ethernet frame the endpoint produces: the
	// largest IPv4 total length plus the Ethernet header.
	maxFrameSize = 65535 + ethernetHeaderLen
	// minMTU is the IPv6 minimum link MTU; below it IPv6 stops working.
	minMTU = 1280
	// maxMTU keeps every frame within maxFrameSize.
	maxMTU = 65535
)

// Config describes one in-process host.
type Config struct {
	// MAC is the host's own Ethernet address. Empty means a random locally
	// administered unicast address, so two hosts built with zero Configs
	// still differ.
	MAC net.HardwareAddr
	// Addrs are the IPv4 and IPv6 addresses on the NIC. The IPv6 link-local
	// address derived from MAC is always added as well.
	Addrs []netip.Prefix
	// MTU is the IP MTU of the link (default 1500, at most 65535).
	MTU int
	// QueueLen bounds the frames waiting for ReadFrames (default 4096). A
	// full queue drops and counts (tx_dropped_queue_full) rather than
	// blocking the stack: WritePackets may run on the goroutine that is
	// delivering a frame from the peer, so blocking could deadlock two
	// hosts joined back to back. The default holds one full 8 MiB TCP
	// window at a 2 KiB MTU: after the MTU drops under a running transfer
	// (an IPoIB mode switch) the stack sends that window as IP fragments,
	// and with 512 slots a burst of them overflowed the queue often enough
	// to cost the connection seconds of retransmission timeouts. A slot is
	// one pointer; the packets it holds are already in the TCP send buffer.
	QueueLen int
	// BatchSize is the largest batch ReadFrames fills (default 64).
	BatchSize int
	// GSO turns on gVisor's host GSO (stack.HostGSOSupported), as TSO on
	// a Linux NIC: the stack's TCP builds segments of up to 64 KiB with a
	// partial checksum and leaves the cutting to the link. A reader that
	// takes super frames (ReadFramesMeta after SetOffloads with TSO) gets
	// them whole; for any other the link cuts them to the MTU
	// (segmenter), so every frame a plain ReadFrames returns still fits.
	// It applies to connections opened afterwards.
	GSO bool
	// TrustRXChecksums skips checksum verification of received packets
	// (CapabilityRXChecksumOffload). Only safe when the peer is trusted to
	// send valid checksums and the link cannot corrupt, e.g. Link in
	// benchmarks.
	TrustRXChecksums bool
	// SkipTXChecksums leaves the TCP and UDP checksums of sent packets
	// uncomputed (CapabilityTXChecksumOffload), as Linux does between two
	// ends of a veth: only for two in-process hosts that both set
	// TrustRXChecksums, since nothing on the way (the engine included)
	// fills the checksum in, and a kernel or a capture would see it as
	// wrong. New rejects it without TrustRXChecksums: the hosts of a pair
	// are built from one template.
	SkipTXChecksums bool
	// TCP tunes the TCP protocol.
	TCP TCPOptions
}

// TCPOptions tunes gVisor's TCP.
type TCPOptions struct {
	// CongestionControl is "cubic" (default) or "reno".
	CongestionControl string
	// DisableSACK turns selective acknowledgements off (on by default).
	DisableSACK bool
	// DisableRACK turns RACK loss detection off (on by default).
	DisableRACK bool
	// BufferDefault is the initial send and receive buffer size (default
	// 8 MiB).
	BufferDefault int
	// BufferMax is the largest send and receive buffer (default 8 MiB).
	BufferMax int
	// MinRTO is the floor of the retransmission timeout (zero keeps
	// gVisor's 200 ms, as Linux). Tests that recover from loss use a few
	// milliseconds.
	MinRTO time.Duration
}

// withDefaults returns cfg with zero fields set to their defaults, or an
// error naming the first invalid field.
func (cfg Config) withDefaults() (Config, error) {
	if len(cfg.MAC) == 0 {
		mac, err := randomMAC()
		if err != nil {
			return cfg, err
		}
		cfg.MAC = mac
	}
	if len(cfg.MAC) != 6 {
		return cfg, fmt.Errorf("MAC %v: want 6 bytes, have %d", cfg.MAC, len(cfg.MAC))
	}
	if cfg.MAC[0]&1 != 0 {
		return cfg, fmt.Errorf("MAC %v is a multicast address", cfg.MAC)
	}
	cfg.MAC = append(net.HardwareAddr(nil), cfg.MAC...)
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if err := checkMTU(cfg.MTU); err != nil {
		return cfg, err
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = DefaultQueueLen
	}
	if cfg.QueueLen < 0 {
		return cfg, fmt.Errorf("QueueLen %d is negative", cfg.QueueLen)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BatchSize < 0 {
		return cfg, fmt.Errorf("BatchSize %d is negative", cfg.BatchSize)
	}
	if cfg.SkipTXChecksums && !cfg.TrustRXChecksums {
		return cfg, errors.New("SkipTXChecksums without TrustRXChecksums: a peer built from this Config would drop every packet")
	}
	for _, p := range cfg.Addrs {
		if !p.IsValid() {
			return cfg, fmt.Errorf("address %v is not a valid prefix", p)
		}
	}
	t := &cfg.TCP
	if t.CongestionControl == "" {
		t.CongestionControl = DefaultCongestionControl
	}
	if t.CongestionControl != "cubic" && t.CongestionControl != "reno" {
		return cfg, fmt.Errorf("TCP congestion control %q: want cubic or reno", t.CongestionControl)
	}
	if t.BufferDefault == 0 {
		t.BufferDefault = DefaultBufferDefault
	}
	if t.BufferMax == 0 {
		t.BufferMax = DefaultBufferMax
	}
	if t.MinRTO < 0 {
		return cfg, fmt.Errorf("TCP MinRTO %v is negative", t.MinRTO)
	}
	if t.BufferDefault < 0 || t.BufferMax < t.BufferDefault {
		return cfg, fmt.Errorf("TCP buffers default %d max %d: want 0 < default <= max", t.BufferDefault, t.BufferMax)
	}
	return cfg, nil
}

func checkMTU(mtu int) error {
	if mtu < minMTU || mtu > maxMTU {
		return fmt.Errorf("MTU %d out of range [%d, %d]", mtu, minMTU, maxMTU)
	}
	return nil
}

// randomMAC returns a random locally administered unicast MAC.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, fmt.Errorf("random MAC: %w", err)
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}
