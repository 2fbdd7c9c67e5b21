package rocev2

import (
	"log/slog"
	"sync"
	"time"
)

// warnEvery is how often one kind of underlay warning may reach the log.
// Datagrams the underlay refuses (EMSGSIZE) or cuts (larger than our
// receive MTU) are black holes for every large IP packet; they are
// counted either way, and this makes them visible without one log line
// per packet.
const warnEvery = 10 * time.Second

// rateLimitedWarn lets one warning through per warnEvery and counts the
// datagrams of the ones it held back; the next warning reports that
// count, so the log accounts for every datagram the counters hold.
type rateLimitedWarn struct {
	mu   sync.Mutex
	last time.Time
	held uint64
}

// warn reports n datagrams lost for the reason msg names, or holds them
// back when a warning of this kind went out less than warnEvery ago.
func (w *rateLimitedWarn) warn(log *slog.Logger, now time.Time, n uint64, msg string, args ...any) {
	w.mu.Lock()
	if !w.last.IsZero() && now.Sub(w.last) < warnEvery {
		w.held += n
		w.mu.Unlock()
		return
	}
	held := w.held
	w.last, w.held = now, 0
	w.mu.Unlock()
	log.Warn(msg, append(args, "datagrams", n, "suppressed_since_last", held)...)
}
