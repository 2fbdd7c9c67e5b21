package control

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// A mode switch is all or nothing, across every interface of every
// process it reaches: "ipoib mode datagram" on a lab with a fabric and an
// 'up' running once switched the first process and failed on the second,
// leaving the hosts in different modes. SetModeAll asks every process
// first and changes nothing unless all answer; a failure while switching
// rolls back what was switched, in the failing process (Server.setMode)
// and in the processes before it (here).

// SetModeAll switches every interface in dir (only host's, if host is
// set; only those named name, if that is set) to mode and returns their
// new state. On error no interface is left switched, unless rolling back
// failed too, which the error then says.
func SetModeAll(dir, host, name, mode string, timeout time.Duration) ([]InterfaceInfo, error) {
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	paths, err := Discover(dir)
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, errNoProcess(dir)
	}
	// Phase 1: every process answers and says what it runs now.
	type target struct {
		path   string
		before []InterfaceInfo
	}
	var targets []target
	for _, p := range paths {
		resp, err := do(p, Request{Op: OpList, Host: host, Name: name}, timeout)
		if err != nil {
			if host != "" && strings.Contains(resp.Error, ErrNoSuchHost.Error()) {
				continue
			}
			return nil, fmt.Errorf("%s: %w; no interface was switched", p, err)
		}
		targets = append(targets, target{p, resp.Interfaces})
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("control: %w: %q in any running process", ErrNoSuchHost, host)
	}
	// Phase 2: switch, rolling back the processes already switched if one
	// fails.
	var after []InterfaceInfo
	for i, t := range targets {
		resp, err := do(t.path, Request{Op: OpMode, Host: host, Name: name, Mode: mode}, timeout)
		if err == nil {
			after = append(after, resp.Interfaces...)
			continue
		}
		var rollback []error
		for _, done := range targets[:i] {
			for _, ifc := range done.before {
				if ifc.Mode == mode {
					continue
				}
				if _, rerr := do(done.path, Request{Op: OpMode, Host: ifc.Host, Name: ifc.Name, Mode: ifc.Mode}, timeout); rerr != nil {
					rollback = append(rollback, fmt.Errorf("%s back to %s: %w", ifc.Host, ifc.Mode, rerr))
				}
			}
		}
		if len(rollback) > 0 {
			return nil, fmt.Errorf("%s: %w; rolling back FAILED, modes differ now: %w", t.path, err, errors.Join(rollback...))
		}
		return nil, fmt.Errorf("%s: %w; every interface is back in its previous mode", t.path, err)
	}
	return after, nil
}

// do sends one request on a fresh connection.
func do(path string, req Request, timeout time.Duration) (Response, error) {
	c, err := Dial(path, timeout)
	if err != nil {
		return Response{}, err
	}
	defer c.Close()
	return c.Do(req)
}

// lockDir takes the exclusive mode lock of dir (a flock on the directory
// itself, so nothing is left behind), waiting for another 'ipoib mode'
// to finish. Concurrent switches then cannot interleave their rollbacks.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		// No directory: nothing runs; Discover says so.
		return func() {}, nil
	}
	if errors.Is(err, os.ErrPermission) {
		return nil, noAccess(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("control: mode lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("control: mode lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// setMode switches eps to mode, all or none: on a failure the ones
// already switched go back.
func (s *Server) setMode(eps []Endpoint, mode string) ([]InterfaceInfo, error) {
	before := make([]string, len(eps))
	for i, e := range eps {
		before[i] = e.Info().Mode
	}
	var infos []InterfaceInfo
	for i, e := range eps {
		err := e.SetMode(mode)
		if err == nil {
			s.log.Info("mode switched", "host", e.Info().Host, "mode", mode)
			infos = append(infos, e.Info())
			continue
		}
		failed := fmt.Errorf("mode %s on %s: %w", mode, e.Info().Host, err)
		var rollback []error
		for j := i; j >= 0; j-- {
			if eps[j].Info().Mode == before[j] {
				continue
			}
			if rerr := eps[j].SetMode(before[j]); rerr != nil {
				rollback = append(rollback, fmt.Errorf("%s back to %s: %w", eps[j].Info().Host, before[j], rerr))
			}
		}
		if len(rollback) > 0 {
			return nil, fmt.Errorf("%w; rolling back failed: %w", failed, errors.Join(rollback...))
		}
		return nil, failed
	}
	return infos, nil
}
