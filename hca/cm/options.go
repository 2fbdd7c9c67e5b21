package cm

import (
	"log/slog"
	"math/rand/v2"
	"time"
)

// Options configure a Manager. Zero fields take the defaults below.
type Options struct {
	// ResponseTimeout is the CM response timeout this side announces in a
	// REQ (Remote and Local CM Response Timeout), rounded up to the 5-bit
	// code. Default 4.096us * 2^20 = 4.3 s, ipoib_cm_send_req's 20. The
	// resend interval follows from it as in Linux: REQ and the active
	// side's DREQ wait 2 * packet life time + the remote CM response
	// timeout (ib_send_cm_req), REP and the passive side's DREQ the REQ's
	// Local CM Response Timeout (cm_req_handler).
	ResponseTimeout time.Duration
	// PacketLifeTime is the path's packet life time, an IBTA 5-bit code;
	// with no subnet administrator to ask, 0 means 16, the
	// CMA_IBOE_PACKET_LIFETIME Linux's rdma_cm assumes on RoCE. It sets
	// the REQ's Local ACK Timeout (cm_ack_timeout) and so the RC
	// transport timeout and the time-wait of both sides.
	PacketLifeTime uint8
	// MaxRetries is Max CM Retries: resends before giving up. Default 15,
	// at most 15 (4 bits on the wire).
	MaxRetries int
	// TimeWait, if non-zero, replaces the time-wait Linux derives from the
	// path's ACK timeout (cm_enter_timewait): how long a disconnected
	// connection keeps answering late MADs before it is forgotten.
	TimeWait time.Duration
	// Seed seeds the local communication IDs and transaction IDs. Zero
	// draws a random seed, so a restarted process does not repeat the comm
	// IDs and TIDs of its previous life (which a peer would take for
	// duplicates).
	Seed int64
	// Logger may be nil.
	Logger *slog.Logger
	// QueueDepth is the number of GSI send slots and of posted 256-byte
	// receive buffers. Default 1024, capped by the device's MaxQPWR.
	QueueDepth int
	// MaxHalfOpen bounds the passive connections whose REQ was answered
	// but whose peer has not yet proved it exists (no RTU, no packet on
	// the QP); a REQ that finds the set full evicts a handshake of the
	// remote GID holding the most (halfopen.go). Default 256.
	MaxHalfOpen int
	// MaxHalfOpenPerGID bounds them per remote GID; REQs over it are
	// rejected with NO_RESOURCES. Default 8.
	MaxHalfOpenPerGID int
}

// Defaults.
const (
	DefaultResponseTimeout = 4096 * time.Nanosecond << 20
	DefaultPacketLifeTime  = 16
	DefaultMaxRetries      = 15
	DefaultQueueDepth      = 1024
	// DefaultMaxHalfOpen is twice Linux IPoIB's max_nonsrq_conn_qp (128):
	// room for every peer of a large subnet to connect at once.
	DefaultMaxHalfOpen       = 256
	DefaultMaxHalfOpenPerGID = 8
)

func (o Options) withDefaults(maxWR int) Options {
	if o.ResponseTimeout <= 0 {
		o.ResponseTimeout = DefaultResponseTimeout
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.MaxRetries > 15 {
		o.MaxRetries = 15
	}
	if o.PacketLifeTime == 0 {
		o.PacketLifeTime = DefaultPacketLifeTime
	}
	o.PacketLifeTime = min(o.PacketLifeTime, 31)
	if o.MaxHalfOpen <= 0 {
		o.MaxHalfOpen = DefaultMaxHalfOpen
	}
	if o.MaxHalfOpenPerGID <= 0 {
		o.MaxHalfOpenPerGID = DefaultMaxHalfOpenPerGID
	}
	o.MaxHalfOpenPerGID = min(o.MaxHalfOpenPerGID, o.MaxHalfOpen)
	if o.QueueDepth <= 0 {
		o.QueueDepth = DefaultQueueDepth
	}
	if maxWR > 0 && o.QueueDepth > maxWR {
		o.QueueDepth = maxWR
	}
	if o.Seed == 0 {
		o.Seed = rand.Int64()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// timeoutCode encodes d as the IBTA 5-bit timeout t, 4.096us * 2^t >= d.
func timeoutCode(d time.Duration) uint8 {
	for t := uint8(0); t < 31; t++ {
		if 4096*time.Nanosecond<<t >= d {
			return t
		}
	}
	return 31
}

// timeoutDuration decodes a 5-bit IBTA timeout.
func timeoutDuration(t uint8) time.Duration {
	return 4096 * time.Nanosecond << (t & 0x1F)
}

// maxPeerTimeout caps the 5-bit timeout codes a peer's message sets for
// our own timers (REP resend, QP ACK timeout, time-wait, MRA wait) at 24,
// 2^16 ms or about 65 s. Linux takes them as they come; a REQ asking for
// 31 would hold our connection state for days.
const maxPeerTimeout = 24

// peerTimeout clamps a peer's timeout code for our timers.
func peerTimeout(t uint8) uint8 { return min(t&0x1F, maxPeerTimeout) }

// convertToMS is Linux cm_convert_to_ms: 4.096us * 2^t approximated as
// 2^(t-8) ms, never below 1 ms. The CM's timers use it so that both
// sides of a connection wait exactly what a Linux peer would.
func convertToMS(t uint8) time.Duration {
	return time.Millisecond << max(int(t&0x1F)-8, 0)
}

// ackTimeout is Linux cm_ack_timeout: 4.096us * 2^t >= the CA's ACK delay
// + twice the packet life time, taking the larger code and rounding up
// by one only when the other is within 50% of it.
func ackTimeout(caACKDelay, packetLifeTime uint8) uint8 {
	t := int(packetLifeTime) + 1
	d := int(caACKDelay)
	if t >= d {
		t += b2i(d >= t-1)
	} else {
		t = d + b2i(t >= d-1)
	}
	return uint8(min(31, t))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
