package control

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ipoibcm/ipoib/internal/proc"
)

// DefaultDir holds the sockets of every running ipoib process.
const DefaultDir = "/run/ipoib"

// Endpoint is one interface as the control socket sees it.
type Endpoint interface {
	// Info describes the interface now.
	Info() InterfaceInfo
	// Stats returns a JSON-marshalable snapshot (ipoibcm.Stats).
	Stats() any
	// SetMode switches the interface to "connected" or "datagram".
	SetMode(mode string) error
}

// SocketPath is the socket the process with the given pid and start time
// (internal/proc.StartTime) serves in dir: <pid>-<start>.sock. The start
// time tells the socket of a dead process from that of a live one which
// was given the same pid later.
func SocketPath(dir string, pid int, start uint64) string {
	return filepath.Join(dir, strconv.Itoa(pid)+"-"+strconv.FormatUint(start, 10)+".sock")
}

// parseSocketName is SocketPath's inverse on a file name; legacy reports a
// <pid>.sock name of an older ipoib, which has no start time.
func parseSocketName(name string) (pid int, start uint64, legacy, ok bool) {
	base, found := strings.CutSuffix(name, ".sock")
	if !found {
		return 0, 0, false, false
	}
	pidStr, startStr, hasStart := strings.Cut(base, "-")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return 0, 0, false, false
	}
	if !hasStart {
		return pid, 0, true, true
	}
	start, err = strconv.ParseUint(startStr, 10, 64)
	if err != nil {
		return 0, 0, false, false
	}
	return pid, start, false, true
}

// ownerAlive reports whether the process that made socket name still
// runs. A legacy name can only be checked by pid.
func ownerAlive(pid int, start uint64, legacy bool) bool {
	if legacy {
		_, err := proc.StartTime(pid)
		return err == nil
	}
	return proc.Alive(pid, start)
}

// removeStale deletes the sockets in dir whose process is gone (or whose
// pid now belongs to another process) and returns the paths kept, of
// running processes. A process killed by a signal cannot remove its own
// socket; its successors do, so the directory does not fill up and no
// client dials a dead socket.
func removeStale(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("control: read %s: %w", dir, err)
	}
	var live []string
	var errs []error
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		pid, start, legacy, ok := parseSocketName(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if ownerAlive(pid, start, legacy) {
			live = append(live, path)
			continue
		}
		// Another process may have removed it first; that is fine.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("control: remove stale socket: %w", err))
		}
	}
	return live, errors.Join(errs...)
}

// Server answers control requests for a fixed set of endpoints.
type Server struct {
	path      string
	ln        *net.UnixListener
	endpoints []Endpoint
	log       *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Permissions of the control directory and sockets: the socket accepts
// "mode", which reconfigures the interface, so only the owner (root, for
// /run/ipoib) may reach it, whatever the umask.
const (
	dirMode    fs.FileMode = 0o700
	socketMode fs.FileMode = 0o600
)

// Listen creates dir if needed and serves endpoints on
// dir/<pid>-<start>.sock
// until Close. Sockets left in dir by processes that are gone are removed
// first.
//
// dir belongs to ipoib (DefaultDir, /run/ipoib): it is made 0700 even if it
// already existed, before the socket is created, so no other user can
// connect in the moment before the socket itself is made 0600. Do not
// point it at a shared directory.
func Listen(dir string, endpoints []Endpoint, logger *slog.Logger) (*Server, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	// MkdirAll honours the umask and leaves an existing directory alone.
	if err := os.Chmod(dir, dirMode); err != nil {
		return nil, fmt.Errorf("control: restrict %s: %w", dir, err)
	}
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	if _, err := removeStale(dir); err != nil {
		return nil, err
	}
	path := SocketPath(dir, os.Getpid(), start)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control: listen: %w", err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control: restrict socket: %w", err)
	}
	// Close removes the file itself, after the accept loop has stopped.
	ln.SetUnlinkOnClose(false)
	eps := slices.Clone(endpoints)
	slices.SortFunc(eps, func(a, b Endpoint) int {
		ia, ib := a.Info(), b.Info()
		if ia.Host != ib.Host {
			return compareHosts(ia.Host, ib.Host)
		}
		return compareHosts(ia.Name, ib.Name)
	})
	s := &Server{path: path, ln: ln, endpoints: eps, log: logger, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Path is the socket's file name.
func (s *Server) Path() string { return s.path }

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("control accept", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 0, 4096), MaxMessage)
	w := bufio.NewWriter(c)
	enc := json.NewEncoder(w)
	for sc.Scan() {
		resp := s.handle(sc.Bytes())
		if err := enc.Encode(resp); err != nil {
			s.log.Warn("control: encode response", "err", err)
			return
		}
		if err := w.Flush(); err != nil {
			return
		}
	}
	if err := sc.Err(); err != nil {
		// An over-long line: answer once, then hang up.
		enc.Encode(Response{Error: fmt.Sprintf("%v: %v", ErrProtocol, err)})
		w.Flush()
	}
}

func (s *Server) handle(line []byte) Response {
	req, err := ParseRequest(line)
	if err != nil {
		return Response{Error: err.Error()}
	}
	eps, err := s.selectEndpoints(req.Host)
	if err != nil {
		return Response{Error: err.Error()}
	}
	resp := Response{PID: os.Getpid()}
	switch req.Op {
	case OpList:
		for _, e := range eps {
			resp.Interfaces = append(resp.Interfaces, e.Info())
		}
	case OpStats:
		for _, e := range eps {
			b, err := json.Marshal(e.Stats())
			if err != nil {
				return Response{Error: fmt.Sprintf("stats of %s: %v", e.Info().Host, err)}
			}
			resp.Stats = append(resp.Stats, InterfaceStats{Interface: e.Info(), Stats: b})
		}
	case OpMode:
		infos, err := s.setMode(eps, req.Mode)
		if err != nil {
			return Response{Error: oneLine(err)}
		}
		resp.Interfaces = infos
	}
	return resp
}

// oneLine keeps a (joined) error on the one line a response carries.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// ErrNoSuchHost is reported when a request names a host the process does
// not serve.
var ErrNoSuchHost = errors.New("no such host")

func (s *Server) selectEndpoints(host string) ([]Endpoint, error) {
	if host == "" {
		return s.endpoints, nil
	}
	for _, e := range s.endpoints {
		if e.Info().Host == host {
			return []Endpoint{e}, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNoSuchHost, host)
}

// Close stops accepting, ends every connection's goroutine and removes the
// socket file.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("control: close: %w", err)
	}
	return nil
}

// compareHosts orders names with numeric suffixes naturally, so h2 comes
// before h10.
func compareHosts(a, b string) int {
	pa, na := splitNumericSuffix(a)
	pb, nb := splitNumericSuffix(b)
	if pa != pb || na < 0 || nb < 0 {
		if a < b {
			return -1
		} else if a > b {
			return 1
		}
		return 0
	}
	return na - nb
}

func splitNumericSuffix(s string) (string, int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	if i == len(s) || len(s)-i > 9 {
		return s, -1
	}
	n, _ := strconv.Atoi(s[i:])
	return s[:i], n
}
