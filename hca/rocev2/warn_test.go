package rocev2

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// warnRecorder is a slog handler that keeps the messages of warnings
// and their attributes.
type warnRecorder struct {
	mu    sync.Mutex
	msgs  []string
	attrs []map[string]string
}

func (r *warnRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *warnRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	a := make(map[string]string)
	rec.Attrs(func(at slog.Attr) bool {
		a[at.Key] = at.Value.String()
		return true
	})
	r.attrs = append(r.attrs, a)
	return nil
}

// withMsg returns the attributes of the warnings whose message contains
// substr, in order.
func (r *warnRecorder) withMsg(substr string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for k, m := range r.msgs {
		if strings.Contains(m, substr) {
			out = append(out, r.attrs[k])
		}
	}
	return out
}
func (r *warnRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *warnRecorder) WithGroup(string) slog.Handler      { return r }

func (r *warnRecorder) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// TestOversizeDatagramWarnsOnce: a peer with a larger IB MTU sends
// datagrams this device cannot take; each is counted as truncated, and the
// log says why once (rate-limited), where it used to say nothing.
func TestOversizeDatagramWarnsOnce(t *testing.T) {
	f := newTestFabric(t, 31, Faults{})
	rec := &warnRecorder{}
	cfg := f.config(t)
	cfg.MTU, cfg.Logger = hca.MTU1024, slog.New(rec)
	d := f.open(t, cfg)
	from := netip.AddrPortFrom(netip.MustParseAddr("127.31.0.200"), f.port)
	big := wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xFFFF, DestQP: 1},
		DETH: wire.DETH{QKey: uint32(hca.QKeyGSI), SrcQP: 1}, Payload: make([]byte, 2048)})
	const n = 20
	for range n {
		sendRaw(t, from, d.LocalAddr(), big)
	}
	f.waitRx(t, d, func(s Stats) bool { return s.Dropped(wire.DropTruncated) == n })
	if got := rec.count("larger than our IB MTU"); got != 1 {
		t.Fatalf("%d warnings for %d oversize datagrams, want exactly 1", got, n)
	}
}

func TestRateLimitedWarnCountsHeldBack(t *testing.T) {
	rec := &warnRecorder{}
	log := slog.New(rec)
	var w rateLimitedWarn
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		w.warn(log, t0.Add(time.Duration(i)*time.Second), 3, "black hole")
	}
	if rec.count("black hole") != 1 || w.held != 12 {
		t.Fatalf("%d warnings, %d datagrams held; want 1 and 12", rec.count("black hole"), w.held)
	}
	w.warn(log, t0.Add(warnEvery), 1, "black hole")
	if ws := rec.withMsg("black hole"); len(ws) != 2 || w.held != 0 || ws[1]["suppressed_since_last"] != "12" {
		t.Fatalf("after the interval: %v, %d held; want 2 warnings, the second with suppressed_since_last=12", ws, w.held)
	}
}
