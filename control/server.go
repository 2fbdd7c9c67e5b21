package control

import (
	"bufio"
	"context"
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
	"sync/atomic"
	"syscall"

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

// ChildParent is an Endpoint that can have P_Key child interfaces (ipoib
// child add/del). The server lists a parent's children after it and
// selects them like any interface; the parent owns them.
type ChildParent interface {
	Endpoint
	// AddChild creates and starts a child; its Info names the parent.
	AddChild(ChildRequest) (Endpoint, error)
	// DeleteChild stops the child named name and removes its TAP.
	DeleteChild(name string) error
	// Children are the running children, sorted by name.
	Children() []Endpoint
}

// Process is the process behind a socket, for the requests that act on
// it as a whole rather than on one interface.
type Process interface {
	// Stopping says what will be gone once the process exited; Stop
	// begins that exit. The server calls Stop after the response with
	// Stopping's answer went out, since the exit closes the socket.
	Stopping() StopInfo
	Stop()
	// Reload re-reads the configuration and applies what can change
	// while running.
	Reload() (ReloadResult, error)
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
	live, _, err := sweep(dir)
	return live, err
}

// ErrNoAccess is reported when this user may not read the control
// directory or connect to a socket in it: the directory is 0700 and the
// sockets 0600, their owner's (the user who started the process, root
// for a fabric or a service), so another user sees no process at all.
var ErrNoAccess = errors.New("permission denied")

// noAccess is ErrNoAccess for path, naming its owner and what to do.
func noAccess(path string) error {
	owner := ""
	var st syscall.Stat_t
	if syscall.Stat(path, &st) == nil {
		owner = fmt.Sprintf(" (uid %d's, mode %#o)", st.Uid, st.Mode&0o777)
	}
	return fmt.Errorf("control: %w: %s%s: the running processes' control sockets are their owner's; run as that user (sudo for root)",
		ErrNoAccess, path, owner)
}

// errNoProcess is the error of a command that found no running process.
func errNoProcess(dir string) error {
	return fmt.Errorf("control: no running ipoib process has a socket in %s (start one with 'ipoib fabric' or 'ipoib up')", dir)
}

// RemoveStale deletes the sockets in dir whose process is gone, as
// Discover does, and returns their paths ('ipoib cleanup').
func RemoveStale(dir string) ([]string, error) {
	_, removed, err := sweep(dir)
	return removed, err
}

// sweep is removeStale returning both the live and the removed paths.
func sweep(dir string) (live, removed []string, _ error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if errors.Is(err, fs.ErrPermission) {
		return nil, nil, noAccess(dir)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("control: read %s: %w", dir, err)
	}
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
			continue
		}
		removed = append(removed, path)
	}
	return live, removed, errors.Join(errs...)
}

// Server answers control requests for a fixed set of endpoints.
type Server struct {
	path      string
	ln        *net.UnixListener
	endpoints []Endpoint
	log       *slog.Logger
	// process answers OpStop and OpReload; nil: refused.
	process atomic.Pointer[processBox]

	// ctx ends at Close: it stops running captures.
	ctx    context.Context
	cancel context.CancelFunc

	// childMu serialises child add/del, so a duplicate is refused by the
	// host that has the first, not raced past.
	childMu sync.Mutex

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
			return CompareHosts(ia.Host, ib.Host)
		}
		return CompareHosts(ia.Name, ib.Name)
	})
	s := &Server{path: path, ln: ln, endpoints: eps, log: logger, conns: map[net.Conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

type processBox struct{ p Process }

// SetProcess makes the server answer OpStop and OpReload with p.
func (s *Server) SetProcess(p Process) { s.process.Store(&processBox{p}) }

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
		if req, err := ParseRequest(sc.Bytes()); err == nil && req.Op == OpCapture {
			// The connection becomes the capture's stream.
			s.serveCapture(c, w, req)
			return
		}
		resp := s.handle(sc.Bytes())
		if err := enc.Encode(resp); err != nil {
			s.log.Warn("control: encode response", "err", err)
			return
		}
		err := w.Flush()
		if resp.Stopping != nil {
			// Answered (or the client went away): now exit.
			s.process.Load().p.Stop()
			return
		}
		if err != nil {
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
	switch req.Op {
	case OpStop, OpReload:
		return s.handleProcess(req)
	}
	var eps []Endpoint
	if req.Op != OpChildAdd && req.Op != OpChildDel {
		if eps, err = s.selectEndpoints(req.Host, req.Name); err != nil {
			return Response{Error: err.Error()}
		}
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
	case OpChildAdd, OpChildDel:
		info, err := s.child(req)
		if err != nil {
			return Response{Error: oneLine(err)}
		}
		resp.Interfaces = []InterfaceInfo{info}
	}
	return resp
}

// handleProcess answers OpStop and OpReload. A host or name in the
// request must be one of the process's interfaces: a client addressing
// ib0 of one process does not stop another.
func (s *Server) handleProcess(req Request) Response {
	if req.Host != "" || req.Name != "" {
		if _, err := s.selectEndpoints(req.Host, req.Name); err != nil {
			return Response{Error: err.Error()}
		}
	}
	box := s.process.Load()
	if box == nil {
		return Response{Error: fmt.Sprintf("this process does not take %s requests", req.Op)}
	}
	resp := Response{PID: os.Getpid()}
	switch req.Op {
	case OpStop:
		info := box.p.Stopping()
		info.Socket = s.path
		resp.Stopping = &info
		s.log.Info("stop requested over the control socket")
	case OpReload:
		r, err := box.p.Reload()
		if err != nil {
			return Response{Error: oneLine(err)}
		}
		resp.Reload = &r
	}
	return resp
}

// child adds or deletes the child req names.
func (s *Server) child(req Request) (InterfaceInfo, error) {
	s.childMu.Lock()
	defer s.childMu.Unlock()
	c := *req.Child
	if req.Op == OpChildAdd {
		p, err := s.parent(req.Host, req.Name)
		if err != nil {
			return InterfaceInfo{}, err
		}
		ep, err := p.AddChild(c)
		if err != nil {
			return InterfaceInfo{}, fmt.Errorf("child add on %s: %w", p.Info().Host, err)
		}
		info := ep.Info()
		s.log.Info("child added", "host", info.Host, "dev", info.Name, "pkey", info.PKey, "membership", info.Membership)
		return info, nil
	}
	var victim *InterfaceInfo
	for _, e := range s.allEndpoints() {
		info := e.Info()
		if info.Host != req.Host || info.Parent == "" {
			continue
		}
		if (c.Name != "" && info.Name == c.Name) || (c.Name == "" && info.PKey == PKeyString(c.PKey|0x8000)) {
			victim = &info
			break
		}
	}
	if victim == nil {
		what := c.Name
		if what == "" {
			what = "in partition " + PKeyString(c.PKey|0x8000)
		}
		if _, err := s.selectEndpoints(req.Host, ""); err != nil {
			return InterfaceInfo{}, err
		}
		return InterfaceInfo{}, fmt.Errorf("%w: %s has no child %s", ErrNoSuchInterface, req.Host, what)
	}
	p, err := s.parent(victim.Host, victim.Parent)
	if err != nil {
		return InterfaceInfo{}, err
	}
	if err := p.DeleteChild(victim.Name); err != nil {
		return InterfaceInfo{}, fmt.Errorf("child del on %s: %w", victim.Host, err)
	}
	s.log.Info("child deleted", "host", victim.Host, "dev", victim.Name)
	return *victim, nil
}

// parent is the interface of host (named name, if set) that takes
// children; with no host, the process's only one.
func (s *Server) parent(host, name string) (ChildParent, error) {
	var found []Endpoint
	for _, e := range s.endpoints {
		info := e.Info()
		if (host == "" || info.Host == host) && (name == "" || info.Name == name) {
			found = append(found, e)
		}
	}
	switch {
	case len(found) == 0 && host == "":
		return nil, fmt.Errorf("%w: this process runs no interface", ErrNoSuchHost)
	case len(found) == 0:
		return nil, fmt.Errorf("%w: %q", ErrNoSuchHost, host)
	case len(found) > 1:
		return nil, fmt.Errorf("%d interfaces match; name the host", len(found))
	}
	p, ok := found[0].(ChildParent)
	if !ok {
		return nil, fmt.Errorf("%s: %s takes no children", found[0].Info().Host, found[0].Info().Name)
	}
	return p, nil
}

// oneLine keeps a (joined) error on the one line a response carries.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// ErrNoSuchHost is reported when a request names a host the process does
// not serve; ErrNoSuchInterface when the host has no interface of the
// name.
var (
	ErrNoSuchHost      = errors.New("no such host")
	ErrNoSuchInterface = errors.New("no such interface")
)

// allEndpoints are the endpoints, each parent followed by its children.
func (s *Server) allEndpoints() []Endpoint {
	out := make([]Endpoint, 0, len(s.endpoints))
	for _, e := range s.endpoints {
		out = append(out, e)
		if p, ok := e.(ChildParent); ok {
			out = append(out, p.Children()...)
		}
	}
	return out
}

// selectEndpoints picks the interfaces of host (all: empty), only the
// one named name if that is set.
func (s *Server) selectEndpoints(host, name string) ([]Endpoint, error) {
	all := s.allEndpoints()
	if host == "" && name == "" {
		return all, nil
	}
	var out []Endpoint
	hostSeen := false
	for _, e := range all {
		info := e.Info()
		if host != "" && info.Host != host {
			continue
		}
		hostSeen = true
		if name == "" || info.Name == name {
			out = append(out, e)
		}
	}
	switch {
	case !hostSeen:
		return nil, fmt.Errorf("%w: %q", ErrNoSuchHost, host)
	case len(out) == 0 && host == "":
		return nil, fmt.Errorf("%w: %q", ErrNoSuchInterface, name)
	case len(out) == 0:
		return nil, fmt.Errorf("%w: %q on %s", ErrNoSuchInterface, name, host)
	}
	return out, nil
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
	s.cancel()
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

// CompareHosts orders host names with numeric suffixes naturally, so h2
// comes before h10, as show sorts them.
func CompareHosts(a, b string) int {
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
