// Package sdnotify speaks the service manager's readiness protocol
// (sd_notify(3)): newline-separated VAR=value assignments, one datagram
// each, to the unix datagram socket $NOTIFY_SOCKET names. It is written
// out rather than imported: the protocol is one sendto on a socket the
// standard library already dials, and the state names are the caller's.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// Common assignments (sd_notify(3)).
const (
	Ready     = "READY=1"
	Stopping  = "STOPPING=1"
	Reloading = "RELOADING=1"
)

// Status is the STATUS= line a service manager shows ('systemctl status').
func Status(s string) string { return "STATUS=" + strings.ReplaceAll(s, "\n", " ") }

// ErrNoSocket is returned by Send when no socket was given (not run by a
// service manager that wants notifications): callers ignore it.
var ErrNoSocket = errors.New("sdnotify: no NOTIFY_SOCKET")

// Notifier sends to one socket; the zero value (no socket) sends nothing.
type Notifier struct {
	addr *net.UnixAddr
}

// New is the notifier of socket, $NOTIFY_SOCKET: a path, or an abstract
// socket spelled with a leading '@'. Empty is no service manager.
func New(socket string) (*Notifier, error) {
	if socket == "" {
		return &Notifier{}, nil
	}
	if socket[0] != '/' && socket[0] != '@' {
		return nil, fmt.Errorf("sdnotify: NOTIFY_SOCKET %q is neither a path nor an abstract socket", socket)
	}
	// The standard library maps a leading '@' to the abstract namespace.
	return &Notifier{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}}, nil
}

// Enabled reports whether notifications go anywhere.
func (n *Notifier) Enabled() bool { return n.addr != nil }

// Send sends the assignments as one datagram.
func (n *Notifier) Send(assignments ...string) error {
	if n.addr == nil {
		return ErrNoSocket
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(strings.Join(assignments, "\n") + "\n")); err != nil {
		return fmt.Errorf("sdnotify: send: %w", err)
	}
	return nil
}
