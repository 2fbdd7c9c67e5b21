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
// ones it held back; the next warning reports that count.
type rateLimitedWarn struct {
	mu   sync.Mutex
	last time.Time
	held uint64
}

func (w *rateLimitedWarn) warn(log *slog.Logger, now time.Time, msg string, args ...any) {
	w.mu.Lock()
	if !w.last.IsZero() && now.Sub(w.last) < warnEvery {
		w.held++
		w.mu.Unlock()
		return
	}
	held := w.held
	w.last, w.held = now, 0
	w.mu.Unlock()
	log.Warn(msg, append(args, "suppressed_since_last", held)...)
}
