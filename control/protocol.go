package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Op names a request.
type Op string

// Operations.
const (
	OpList  Op = "list"
	OpStats Op = "stats"
	OpMode  Op = "mode"
	// OpCapture answers with one response line, then streams a pcapng
	// capture of one host's HCA on the same connection until it ends.
	OpCapture Op = "capture"
)

// MaxMessage bounds one request or response line; a longer line is a
// protocol error, not a reason to grow a buffer without limit.
const MaxMessage = 16 << 20

// ErrProtocol is wrapped by every malformed-message error.
var ErrProtocol = errors.New("control protocol error")

// Request is one line from a client.
type Request struct {
	Op Op `json:"op"`
	// Host selects one interface by host name; empty means all of the
	// process's interfaces (a mode switch is then all or nothing).
	Host string `json:"host,omitempty"`
	// Mode is the target mode of OpMode: "connected" or "datagram".
	Mode string `json:"mode,omitempty"`
	// Capture holds the filter and bounds of OpCapture.
	Capture *CaptureRequest `json:"capture,omitempty"`
}

// InterfaceInfo identifies one interface of the process.
type InterfaceInfo struct {
	Host   string   `json:"host"`   // e.g. "ipoib-h1", the namespace or host name
	Name   string   `json:"name"`   // e.g. "ib0"
	Mode   string   `json:"mode"`   // "connected" or "datagram"
	MTU    int      `json:"mtu"`    // current IP MTU
	HWAddr string   `json:"hwaddr"` // 20-byte IPoIB address, colon hex
	LinkUp bool     `json:"link_up"`
	Addrs  []string `json:"addrs,omitempty"`
	// Notes say what the host did to the interface that the engine did
	// not follow (an MTU above the mode's limit, the link set down).
	Notes []string `json:"notes,omitempty"`
}

// InterfaceStats is one interface's snapshot: Stats is the engine's Stats
// value as JSON.
type InterfaceStats struct {
	Interface InterfaceInfo   `json:"interface"`
	Stats     json.RawMessage `json:"stats"`
}

// Response is one line from the server. Error is set on failure and the
// other fields are then empty.
type Response struct {
	Error      string           `json:"error,omitempty"`
	PID        int              `json:"pid,omitempty"`
	Interfaces []InterfaceInfo  `json:"interfaces,omitempty"`
	Stats      []InterfaceStats `json:"stats,omitempty"`
}

// decodeLine decodes exactly one JSON object from line into v, rejecting
// unknown fields and trailing data so a confused peer is noticed.
func decodeLine(line []byte, v any) error {
	if len(line) > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes exceeds %d", ErrProtocol, len(line), MaxMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after message", ErrProtocol)
	}
	return nil
}

// ParseRequest decodes and validates a request line.
func ParseRequest(line []byte) (Request, error) {
	var r Request
	if err := decodeLine(line, &r); err != nil {
		return Request{}, err
	}
	switch r.Op {
	case OpList, OpStats:
	case OpCapture:
		if c := r.Capture; c != nil {
			switch c.Kind {
			case "", "all", "cm", "data":
			default:
				return Request{}, fmt.Errorf("%w: capture kind %q", ErrProtocol, c.Kind)
			}
			if c.QPN > 0xFFFFFF || c.DurationMS < 0 {
				return Request{}, fmt.Errorf("%w: capture qpn %d or duration %d ms out of range", ErrProtocol, c.QPN, c.DurationMS)
			}
		}
	case OpMode:
		if r.Mode == "" {
			return Request{}, fmt.Errorf("%w: mode request without a mode", ErrProtocol)
		}
	default:
		return Request{}, fmt.Errorf("%w: unknown op %q", ErrProtocol, r.Op)
	}
	return r, nil
}

// ParseResponse decodes a response line.
func ParseResponse(line []byte) (Response, error) {
	var r Response
	if err := decodeLine(line, &r); err != nil {
		return Response{}, err
	}
	return r, nil
}
