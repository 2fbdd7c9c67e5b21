package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves /metrics (Prometheus text or OpenMetrics, as the scraper
// asks) on one address until Close.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// Serve listens on addr (host:port; port 0 picks one) and serves m.
func Serve(addr string, m *Metrics, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{
		EnableOpenMetrics: true,
		ErrorHandling:     promhttp.ContinueOnError,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	s := &Server{ln: ln, done: make(chan struct{}), srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
	}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server", "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server and waits for its goroutine.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	if err != nil {
		return fmt.Errorf("metrics: close: %w", err)
	}
	return nil
}
