package control

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ChildAdd asks the process in dir that runs host to create the child c
// and returns it. With no host the one interface running in dir is meant;
// several are an error naming them, so a child never lands on a host the
// user did not mean.
func ChildAdd(dir, host string, c ChildRequest, timeout time.Duration) (InterfaceInfo, error) {
	return childOp(dir, Request{Op: OpChildAdd, Host: host, Child: &c}, timeout)
}

// ChildDel asks the process in dir that runs host to remove its child
// named name, or in partition pkey when name is empty.
func ChildDel(dir, host, name string, pkey uint16, timeout time.Duration) (InterfaceInfo, error) {
	return childOp(dir, Request{Op: OpChildDel, Host: host, Child: &ChildRequest{Name: name, PKey: pkey}}, timeout)
}

func childOp(dir string, req Request, timeout time.Duration) (InterfaceInfo, error) {
	if req.Host == "" {
		host, err := onlyHost(dir, timeout)
		if err != nil {
			return InterfaceInfo{}, err
		}
		req.Host = host
	}
	// Only the process that runs the host answers; the others say they
	// have no such host.
	paths, err := Discover(dir)
	if err != nil {
		return InterfaceInfo{}, err
	}
	for _, p := range paths {
		resp, err := do(p, req, timeout)
		switch {
		case err != nil && strings.Contains(resp.Error, ErrNoSuchHost.Error()):
			continue
		case resp.Error != "":
			// The host's own words, without the socket's path: the
			// user named a host, not a socket.
			return InterfaceInfo{}, errors.New(resp.Error)
		case err != nil:
			return InterfaceInfo{}, fmt.Errorf("%s: %w", p, err)
		case len(resp.Interfaces) != 1:
			return InterfaceInfo{}, fmt.Errorf("control: %s: %s answered %d interfaces, want 1", req.Op, p, len(resp.Interfaces))
		}
		return resp.Interfaces[0], nil
	}
	return InterfaceInfo{}, fmt.Errorf("%w: %q in any running process", ErrNoSuchHost, req.Host)
}

// onlyHost is the host of the one parent interface running in dir.
func onlyHost(dir string, timeout time.Duration) (string, error) {
	resps, err := QueryAll(dir, Request{Op: OpList}, timeout)
	if err != nil {
		return "", err
	}
	var hosts []string
	for _, r := range resps {
		for _, i := range r.Interfaces {
			if i.Parent == "" {
				hosts = append(hosts, i.Host)
			}
		}
	}
	switch len(hosts) {
	case 1:
		return hosts[0], nil
	case 0:
		return "", errors.New("control: no interface is running")
	}
	n := len(hosts)
	if n > 4 {
		hosts = append(hosts[:3], "...")
	}
	return "", fmt.Errorf("control: %d hosts run (%s); name one with --host", n, strings.Join(hosts, ", "))
}
