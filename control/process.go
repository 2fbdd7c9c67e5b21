package control

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Target is one running process found by the interface it serves.
type Target struct {
	Socket    string
	PID       int
	Interface InterfaceInfo
}

// ErrNoTarget is wrapped when no running process serves the interface
// asked for; ErrAmbiguous when more than one does.
var (
	ErrNoTarget  = errors.New("no running ipoib serves it")
	ErrAmbiguous = errors.New("more than one running ipoib serves it")
)

// FindProcess finds the one process in dir serving a parent interface
// named name (any, if empty) of host (any, if empty).
func FindProcess(dir, host, name string, timeout time.Duration) (Target, error) {
	paths, err := Discover(dir)
	if err != nil {
		return Target{}, err
	}
	var found []Target
	var errs []error
	for _, p := range paths {
		c, err := Dial(p, timeout)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := c.Do(Request{Op: OpList})
		c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		for _, i := range resp.Interfaces {
			if i.Parent == "" && (host == "" || i.Host == host) && (name == "" || i.Name == name) {
				found = append(found, Target{Socket: p, PID: resp.PID, Interface: i})
			}
		}
	}
	what := describe(host, name)
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		var hosts []string
		for _, t := range found {
			hosts = append(hosts, t.Interface.Host)
		}
		return Target{}, fmt.Errorf("%s: %w (hosts %s): name one with --host", what, ErrAmbiguous, strings.Join(hosts, ", "))
	}
	return Target{}, errors.Join(fmt.Errorf("%s: %w in %s", what, ErrNoTarget, dir), errors.Join(errs...))
}

func describe(host, name string) string {
	switch {
	case host != "" && name != "":
		return name + " of " + host
	case host != "":
		return "host " + host
	case name != "":
		return name
	}
	return "an interface"
}

// Ask sends one process-wide request (OpStop, OpReload) to t.
func (t Target) Ask(op Op, timeout time.Duration) (Response, error) {
	c, err := Dial(t.Socket, timeout)
	if err != nil {
		return Response{}, err
	}
	defer c.Close()
	return c.Do(Request{Op: op, Host: t.Interface.Host, Name: t.Interface.Name})
}
