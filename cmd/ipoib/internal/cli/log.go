package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
)

// newLeveledLogger is the logger of a long-running command: logfmt lines
// (slog's text handler: level=, no colour) on stderr at level, which a
// reload may change. Under journald (Env.Journal) each line starts with
// its syslog priority, <3> to <7>, which journald strips and keeps as the
// entry's priority (SyslogLevelPrefix=, on by default), so 'journalctl
// -p warning' finds the warnings.
func newLeveledLogger(env *Env, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if !env.Journal {
		return slog.New(slog.NewTextHandler(env.Stderr, opts))
	}
	j := &journalHandler{out: env.Stderr, shared: &journalBuf{}}
	j.inner = slog.NewTextHandler(&j.shared.buf, opts)
	return slog.New(j)
}

// journalHandler prefixes each text-handler record with its priority.
// Handlers derived by WithAttrs/WithGroup share one buffer and lock: the
// text handler writes each record with one Write into it.
type journalHandler struct {
	inner  slog.Handler
	out    io.Writer
	shared *journalBuf
}

type journalBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	s := h.shared
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
	s.buf.WriteString(syslogPriority(r.Level))
	if err := h.inner.Handle(ctx, r); err != nil {
		return err
	}
	_, err := h.out.Write(s.buf.Bytes())
	return err
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &journalHandler{inner: h.inner.WithAttrs(as), out: h.out, shared: h.shared}
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	return &journalHandler{inner: h.inner.WithGroup(name), out: h.out, shared: h.shared}
}

// syslogPriority is the sd-daemon(3) prefix of a level: err, warning,
// info, debug.
func syslogPriority(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "<3>"
	case l >= slog.LevelWarn:
		return "<4>"
	case l >= slog.LevelInfo:
		return "<6>"
	}
	return "<7>"
}
