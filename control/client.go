package control

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"time"
)

// Client is one connection to a control socket.
type Client struct {
	conn    net.Conn
	r       *bufio.Reader
	timeout time.Duration
}

// Dial connects to the socket at path; every request must complete within
// timeout.
func Dial(path string, timeout time.Duration) (*Client, error) {
	c, err := net.DialTimeout("unix", path, timeout)
	if errors.Is(err, fs.ErrPermission) {
		return nil, noAccess(path)
	}
	if err != nil {
		return nil, fmt.Errorf("control: dial %s: %w", path, err)
	}
	return &Client{conn: c, r: bufio.NewReaderSize(c, 64<<10), timeout: timeout}, nil
}

// Do sends one request and returns its response. A response carrying an
// error comes back as a Go error.
func (c *Client) Do(req Request) (Response, error) {
	if err := c.conn.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return Response{}, fmt.Errorf("control: %w", err)
	}
	b, err := jsonLine(req)
	if err != nil {
		return Response{}, err
	}
	if _, err := c.conn.Write(b); err != nil {
		return Response{}, fmt.Errorf("control: send %s: %w", req.Op, err)
	}
	line, err := readLine(c.r)
	if err != nil {
		return Response{}, fmt.Errorf("control: receive %s: %w", req.Op, err)
	}
	resp, err := ParseResponse(line)
	if err != nil {
		return Response{}, err
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("control: %s: %s", req.Op, resp.Error)
	}
	return resp, nil
}

// jsonLine is v as one JSON line.
func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("control: encode: %w", err)
	}
	return append(b, '\n'), nil
}

// writeResponse writes resp as one line and flushes; false if the peer
// is gone.
func writeResponse(w *bufio.Writer, resp Response) bool {
	b, err := jsonLine(resp)
	if err != nil {
		return false
	}
	if _, err := w.Write(b); err != nil {
		return false
	}
	return w.Flush() == nil
}

// readLine reads one newline-terminated line of at most MaxMessage bytes.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxMessage {
			return nil, fmt.Errorf("%w: response longer than %d bytes", ErrProtocol, MaxMessage)
		}
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Discover lists the sockets in dir that belong to running processes and
// removes those of processes that are gone (a pid reused by another
// process counts as gone: the start time in the name tells them apart).
// Without write permission on dir the stale ones are skipped, not removed;
// without read permission it fails with ErrNoAccess, never reporting "no
// process" while one runs.
func Discover(dir string) ([]string, error) {
	live, err := removeStale(dir)
	if errors.Is(err, ErrNoAccess) {
		return nil, err
	}
	if errors.Is(err, fs.ErrPermission) {
		return live, nil
	}
	if err != nil {
		return nil, fmt.Errorf("control: discover: %w", err)
	}
	return live, nil
}

// QueryAll sends req to every running process in dir and gathers the
// responses. A host filter that matches no interface of a process is not
// an error for that process; it is an error only if no process has it.
func QueryAll(dir string, req Request, timeout time.Duration) ([]Response, error) {
	paths, err := Discover(dir)
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, errNoProcess(dir)
	}
	var resps []Response
	var errs []error
	noHost := 0
	for _, p := range paths {
		c, err := Dial(p, timeout)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := c.Do(req)
		c.Close()
		if err != nil {
			if req.Host != "" && strings.Contains(resp.Error, ErrNoSuchHost.Error()) {
				noHost++
				continue
			}
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		resps = append(resps, resp)
	}
	if len(resps) == 0 && noHost > 0 && len(errs) == 0 {
		return nil, fmt.Errorf("control: %w: %q in any running process", ErrNoSuchHost, req.Host)
	}
	return resps, errors.Join(errs...)
}
