package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"
)

// CaptureRequest is the filter and the bounds of an OpCapture.
type CaptureRequest struct {
	// QPN records only traffic of this QP (0: any).
	QPN uint32 `json:"qpn,omitempty"`
	// Kind is "all" (or empty), "cm" or "data".
	Kind string `json:"kind,omitempty"`
	// Count stops the capture when it holds this many packets (frames
	// and event records, as tshark lists them; 0: no limit).
	Count uint64 `json:"count,omitempty"`
	// DurationMS stops after this long (0: until the client hangs up).
	DurationMS int64 `json:"duration_ms,omitempty"`
}

// Capturer is an Endpoint that can record its HCA's traffic as pcapng
// (the soft fabric's hosts).
type Capturer interface {
	// Capture writes a pcapng capture of the endpoint's traffic to w
	// until ctx ends or it holds req.Count packets.
	Capture(ctx context.Context, req CaptureRequest, w io.Writer) error
}

// maxCaptureDuration bounds one capture request.
const maxCaptureDuration = 24 * time.Hour

// captureDrain is how long an interrupted client waits for the server to
// write what it has queued and hang up: the queue is at most
// capture.DefaultBudget, a fraction of a second's writing.
const captureDrain = 3 * time.Second

// serveCapture answers an OpCapture on c: one response line, then the
// pcapng stream until the capture ends; the caller closes c. A capture
// ends at its count or duration, when the client hangs up, or when the
// server closes.
func (s *Server) serveCapture(c net.Conn, w *bufio.Writer, req Request) {
	fail := func(msg string) {
		writeResponse(w, Response{Error: msg})
	}
	eps, err := s.selectEndpoints(req.Host, "")
	if err != nil {
		fail(err.Error())
		return
	}
	// Children share their parent's HCA: capturing a host is capturing
	// its device, which the parent stands for.
	eps = slices.DeleteFunc(eps, func(e Endpoint) bool { return e.Info().Parent != "" })
	if len(eps) != 1 {
		fail(fmt.Sprintf("capture: %d interfaces in this process; name one with host", len(eps)))
		return
	}
	capt, ok := eps[0].(Capturer)
	if !ok {
		fail(fmt.Sprintf("capture: %s cannot capture (only the soft fabric's hosts can)", eps[0].Info().Host))
		return
	}
	cr := CaptureRequest{}
	if req.Capture != nil {
		cr = *req.Capture
	}
	if !writeResponse(w, Response{PID: os.Getpid(), Interfaces: []InterfaceInfo{eps[0].Info()}}) {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	if cr.DurationMS > 0 {
		d := min(time.Duration(cr.DurationMS)*time.Millisecond, maxCaptureDuration)
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, d)
		defer stop()
	}
	// The client sends nothing more: a read returning means it hung up.
	go func() {
		var b [1]byte
		c.Read(b[:])
		cancel()
	}()
	if err := capt.Capture(ctx, cr, w); err != nil && !errors.Is(err, net.ErrClosed) {
		s.log.Warn("capture", "host", eps[0].Info().Host, "err", err)
	}
	w.Flush()
}

// Capture asks the process serving host in dir for a capture and copies
// the pcapng stream to out until the server ends it or ctx ends. It
// returns the interface captured and the bytes copied.
func Capture(ctx context.Context, dir, host string, req CaptureRequest, out io.Writer) (InterfaceInfo, int64, error) {
	paths, err := Discover(dir)
	if err != nil {
		return InterfaceInfo{}, 0, err
	}
	if len(paths) == 0 {
		return InterfaceInfo{}, 0, errNoProcess(dir)
	}
	var errs []error
	for _, p := range paths {
		info, n, err := captureFrom(ctx, p, host, req, out)
		if err == nil || n > 0 {
			return info, n, err
		}
		if strings.Contains(err.Error(), ErrNoSuchHost.Error()) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
	}
	if len(errs) == 0 {
		return InterfaceInfo{}, 0, fmt.Errorf("control: %w: %q in any running process", ErrNoSuchHost, host)
	}
	return InterfaceInfo{}, 0, errors.Join(errs...)
}

func captureFrom(ctx context.Context, path, host string, req CaptureRequest, out io.Writer) (InterfaceInfo, int64, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if errors.Is(err, os.ErrPermission) {
		return InterfaceInfo{}, 0, noAccess(path)
	}
	if err != nil {
		return InterfaceInfo{}, 0, fmt.Errorf("control: dial %s: %w", path, err)
	}
	defer c.Close()
	// Interrupted, the client asks the server to end the capture the way
	// --count and --duration do (a half-close, which the server reads as
	// the client leaving): it writes what it has queued and hangs up at a
	// block boundary. A server that does not within captureDrain is cut
	// off; copyPcapngBlocks drops the partial block.
	stop := context.AfterFunc(ctx, func() {
		if uc, ok := c.(*net.UnixConn); !ok || uc.CloseWrite() != nil {
			c.Close()
			return
		}
		c.SetReadDeadline(time.Now().Add(captureDrain))
	})
	defer stop()
	b, err := jsonLine(Request{Op: OpCapture, Host: host, Capture: &req})
	if err != nil {
		return InterfaceInfo{}, 0, err
	}
	if _, err := c.Write(b); err != nil {
		return InterfaceInfo{}, 0, fmt.Errorf("control: send capture: %w", err)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	line, err := readLine(r)
	if err != nil {
		return InterfaceInfo{}, 0, fmt.Errorf("control: receive capture: %w", err)
	}
	resp, err := ParseResponse(line)
	if err != nil {
		return InterfaceInfo{}, 0, err
	}
	if resp.Error != "" {
		return InterfaceInfo{}, 0, fmt.Errorf("control: capture: %s", resp.Error)
	}
	var info InterfaceInfo
	if len(resp.Interfaces) == 1 {
		info = resp.Interfaces[0]
	}
	n, err := copyPcapngBlocks(out, r)
	if ctx.Err() != nil && !errors.Is(err, errPcapngStream) && !errors.Is(err, errCaptureOut) {
		err = nil // the user ended it; what arrived, in whole blocks, is the capture
	}
	if err != nil {
		return info, n, fmt.Errorf("control: capture stream: %w", err)
	}
	return info, n, nil
}
