package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipoibcm/ipoib/internal/flagcheck"
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
	// OpChildAdd creates a P_Key child interface of Host's parent
	// interface (Child says which); OpChildDel removes the child named
	// Child.Name (or in partition Child.PKey) of Host. Both answer with
	// the child's InterfaceInfo.
	OpChildAdd Op = "child_add"
	OpChildDel Op = "child_del"
	// OpStop asks the process to exit in order ('ipoib down'); it answers
	// with what it will remove, then removes it and exits. OpReload asks
	// it to re-read its configuration ('ipoib reload', as SIGHUP).
	OpStop   Op = "stop"
	OpReload Op = "reload"
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
	// Name selects, with Host, one interface of the host by name (e.g.
	// "ib0.8001"); empty means all of the host's interfaces, its children
	// included.
	Name string `json:"name,omitempty"`
	// Mode is the target mode of OpMode: "connected" or "datagram".
	Mode string `json:"mode,omitempty"`
	// Child names the child of OpChildAdd and OpChildDel.
	Child *ChildRequest `json:"child,omitempty"`
	// Capture holds the filter and bounds of OpCapture.
	Capture *CaptureRequest `json:"capture,omitempty"`
}

// ChildRequest describes a P_Key child interface (ipoib child add/del).
type ChildRequest struct {
	// PKey is the partition. Where ipoib stands in for the subnet manager
	// (the soft fabric, a RoCEv2 port) its bit 15 is the membership the
	// port's P_Key table gets for it: set full, clear limited. The
	// interface itself always carries the bit (its broadcast group).
	PKey uint16 `json:"pkey,omitempty"`
	// Name is the TAP's name; empty: <parent>.<pkey as 4 hex digits>.
	Name string `json:"name,omitempty"`
	// Addrs are IP prefixes the TAP gets (OpChildAdd).
	Addrs []string `json:"addrs,omitempty"`
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
	// PKey is the interface's partition as 0x-prefixed hex with the
	// full-membership bit ("0xffff", "0x8001"); Membership is the port's
	// membership of it from its P_Key table: "full", "limited", or
	// "none" while the table lacks it. Empty when the backend does not say.
	PKey       string `json:"pkey,omitempty"`
	Membership string `json:"membership,omitempty"`
	// Parent names the parent interface of a P_Key child ("ib0"); empty
	// for a parent.
	Parent string `json:"parent,omitempty"`
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
	// Stopping answers OpStop, Reload OpReload.
	Stopping *StopInfo     `json:"stopping,omitempty"`
	Reload   *ReloadResult `json:"reload,omitempty"`
}

// StopInfo is what a stopping process will have removed once it exited:
// a client waits for each to be gone.
type StopInfo struct {
	PID int `json:"pid"`
	// Start is the process's start time (internal/proc.StartTime), which
	// tells it from a later process given the same pid.
	Start uint64 `json:"start"`
	// Socket is the control socket's path.
	Socket string `json:"socket"`
	// TAPs are the kernel interfaces it made in the client's namespace
	// (none for a fabric, whose TAPs live in its namespaces).
	TAPs []string `json:"taps,omitempty"`
	// Namespaces are the named network namespaces it made.
	Namespaces []string `json:"namespaces,omitempty"`
}

// ReloadResult says what a reload changed: Applied are one line each,
// NotLive the keys that changed in the file but cannot change while the
// process runs (left as they were).
type ReloadResult struct {
	Applied []string `json:"applied,omitempty"`
	NotLive []string `json:"not_live,omitempty"`
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
	case OpList, OpStats, OpStop, OpReload:
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
	case OpChildAdd, OpChildDel:
		if err := r.checkChild(); err != nil {
			return Request{}, err
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

// checkChild validates a child request: a host, a valid P_Key (not
// 0x0000 or 0x8000, IBTA's invalid ones), an interface name the kernel
// takes, addresses that parse; a deletion names the child by name or
// P_Key.
func (r Request) checkChild() error {
	c := r.Child
	switch {
	case c == nil:
		return fmt.Errorf("%w: %s request without a child", ErrProtocol, r.Op)
	case r.Op == OpChildAdd && c.PKey&0x7FFF == 0, r.Op == OpChildDel && c.PKey != 0 && c.PKey&0x7FFF == 0:
		return fmt.Errorf("%w: P_Key 0x%04x is not a partition (0x0000 and 0x8000 are invalid)", ErrProtocol, c.PKey)
	case r.Op == OpChildDel && c.PKey == 0 && c.Name == "":
		return fmt.Errorf("%w: child_del names neither the child nor its P_Key", ErrProtocol)
	case r.Op == OpChildDel && len(c.Addrs) > 0:
		return fmt.Errorf("%w: child_del with addresses", ErrProtocol)
	}
	if c.Name != "" {
		if msg := flagcheck.Ifname("name", c.Name); msg != "" {
			return fmt.Errorf("%w: %s", ErrProtocol, msg)
		}
	}
	if len(c.Addrs) > maxChildAddrs {
		return fmt.Errorf("%w: %d addresses, at most %d", ErrProtocol, len(c.Addrs), maxChildAddrs)
	}
	for _, a := range c.Addrs {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("%w: address %q: want an IP prefix like 10.77.1.1/24", ErrProtocol, a)
		}
	}
	return nil
}

// maxChildAddrs bounds the addresses one child add carries.
const maxChildAddrs = 16

// PKeyString formats a P_Key as InterfaceInfo.PKey does.
func PKeyString(k uint16) string { return fmt.Sprintf("0x%04x", k) }
