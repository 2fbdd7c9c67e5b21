package cm

import (
	"log/slog"
	"math/rand/v2"
	"time"
)

// Options configure a Manager. Zero fields take the defaults below.
type Options struct {
	// ResponseTimeout is how long to wait for the answer to a REQ, REP or
	// DREQ before resending it. Default 2s (Linux IPoIB asks for 2^20 *
	// 4.096us = 4.3s; 2s keeps setup snappy on a fabric without SMs).
	ResponseTimeout time.Duration
	// MaxRetries is Max CM Retries: resends before giving up. Default 15,
	// at most 15 (4 bits on the wire).
	MaxRetries int
	// TimeWait is how long a disconnected connection keeps answering late
	// MADs before it is forgotten. Default 1s.
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
	DefaultResponseTimeout = 2 * time.Second
	DefaultMaxRetries      = 15
	DefaultTimeWait        = time.Second
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
	if o.TimeWait <= 0 {
		o.TimeWait = DefaultTimeWait
	}
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
