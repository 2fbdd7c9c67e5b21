package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/proc"
)

// fakeEndpoint stands in for an ipoibcm.Interface.
type fakeEndpoint struct {
	mu    sync.Mutex
	info  InterfaceInfo
	stats map[string]any
	fail  error
}

func (f *fakeEndpoint) Info() InterfaceInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info
}

func (f *fakeEndpoint) Stats() any { return f.stats }

func (f *fakeEndpoint) SetMode(mode string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.info.Mode = mode
	if mode == "datagram" {
		f.info.MTU = 4092
	} else {
		f.info.MTU = 65520
	}
	return nil
}

func newFake(host string) *fakeEndpoint {
	return &fakeEndpoint{
		info: InterfaceInfo{Host: host, Name: "ib0", Mode: "connected", MTU: 65520, LinkUp: true,
			HWAddr: "80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"},
		stats: map[string]any{
			"Counters": map[string]uint64{"rx_packets": 10, "tx_packets": 20, "rx_bytes": 1000, "tx_bytes": 2000},
			"Drops":    map[string]uint64{"tx_unknown_ethertype": 3},
		},
	}
}

func startServer(t *testing.T, eps ...Endpoint) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := Listen(dir, eps, nil)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func TestControlRoundTrip(t *testing.T) {
	h10, h2, h1 := newFake("ipoib-h10"), newFake("ipoib-h2"), newFake("ipoib-h1")
	s, dir := startServer(t, h10, h2, h1)
	start, err := proc.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.Path() != SocketPath(dir, os.Getpid(), start) {
		t.Fatalf("path %s, want %s", s.Path(), SocketPath(dir, os.Getpid(), start))
	}
	c, err := Dial(s.Path(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	resp, err := c.Do(Request{Op: OpList})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var hosts []string
	for _, i := range resp.Interfaces {
		hosts = append(hosts, i.Host)
	}
	if got := strings.Join(hosts, ","); got != "ipoib-h1,ipoib-h2,ipoib-h10" {
		t.Fatalf("list order %s, want natural order h1,h2,h10", got)
	}
	if resp.PID != os.Getpid() {
		t.Fatalf("pid %d, want %d", resp.PID, os.Getpid())
	}

	resp, err = c.Do(Request{Op: OpStats, Host: "ipoib-h2"})
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if len(resp.Stats) != 1 || resp.Stats[0].Interface.Host != "ipoib-h2" {
		t.Fatalf("stats for %+v, want only ipoib-h2", resp.Stats)
	}
	var st struct {
		Counters map[string]uint64
		Drops    map[string]uint64
	}
	if err := json.Unmarshal(resp.Stats[0].Stats, &st); err != nil {
		t.Fatal(err)
	}
	if st.Counters["tx_packets"] != 20 || st.Drops["tx_unknown_ethertype"] != 3 {
		t.Fatalf("stats content %+v", st)
	}

	resp, err = c.Do(Request{Op: OpMode, Host: "ipoib-h1", Mode: "datagram"})
	if err != nil {
		t.Fatalf("mode: %v", err)
	}
	if len(resp.Interfaces) != 1 || resp.Interfaces[0].Mode != "datagram" || resp.Interfaces[0].MTU != 4092 {
		t.Fatalf("mode response %+v, want h1 datagram mtu 4092", resp.Interfaces)
	}
	if h1.Info().Mode != "datagram" || h2.Info().Mode != "connected" {
		t.Fatal("mode switch reached the wrong endpoint")
	}
	h2.fail = errors.New("engine refused")
	if _, err := c.Do(Request{Op: OpMode, Host: "ipoib-h2", Mode: "datagram"}); err == nil || !strings.Contains(err.Error(), "engine refused") {
		t.Fatalf("failing SetMode: %v", err)
	}
	// Without a host every interface switches, or none: h1 switched
	// before h2 refused and is switched back; h10 was never reached.
	if _, err := c.Do(Request{Op: OpMode, Mode: "connected"}); err == nil || !strings.Contains(err.Error(), "engine refused") {
		t.Fatalf("mode of all with one refusing: %v", err)
	}
	if h1.Info().Mode != "datagram" || h2.Info().Mode != "connected" || h10.Info().Mode != "connected" {
		t.Fatalf("after a refused switch of all: h1 %s h2 %s h10 %s, want datagram connected connected",
			h1.Info().Mode, h2.Info().Mode, h10.Info().Mode)
	}
	h2.fail = nil
	resp, err = c.Do(Request{Op: OpMode, Mode: "datagram"})
	if err != nil || len(resp.Interfaces) != 3 || h10.Info().Mode != "datagram" || h2.Info().Mode != "datagram" {
		t.Fatalf("mode of all: %v %+v", err, resp.Interfaces)
	}
	if _, err := c.Do(Request{Op: OpStats, Host: "nope"}); err == nil || !strings.Contains(err.Error(), ErrNoSuchHost.Error()) {
		t.Fatalf("unknown host: %v", err)
	}
	if _, err := c.Do(Request{Op: "reboot"}); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Fatalf("unknown op: %v", err)
	}
}

func TestServerAnswersGarbageAndKeepsServing(t *testing.T) {
	s, _ := startServer(t, newFake("h1"))
	conn, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "{not json\n{\"op\":\"list\"}\n")
	dec := json.NewDecoder(conn)
	var r1, r2 Response
	if err := dec.Decode(&r1); err != nil || !strings.Contains(r1.Error, ErrProtocol.Error()) {
		t.Fatalf("garbage line: %+v, %v", r1, err)
	}
	if err := dec.Decode(&r2); err != nil || len(r2.Interfaces) != 1 {
		t.Fatalf("list after garbage: %+v, %v", r2, err)
	}
}

func TestCloseEndsIdleConnectionsAndRemovesSocket(t *testing.T) {
	dir := t.TempDir()
	s, err := Listen(dir, []Endpoint{newFake("h1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Make sure the server has accepted it before closing.
	fmt.Fprintf(conn, "{\"op\":\"list\"}\n")
	if err := json.NewDecoder(conn).Decode(&Response{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // returns only after every goroutine ended
		t.Fatalf("close: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("idle client after Close: %v, want EOF", err)
	}
	if _, err := os.Stat(s.Path()); !os.IsNotExist(err) {
		t.Fatalf("socket file still there: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestDiscoverAndQueryAll(t *testing.T) {
	s, dir := startServer(t, newFake("ipoib-h1"), newFake("ipoib-h2"))
	// A socket-named file of a pid that cannot exist is skipped.
	stale := filepath.Join(dir, "999999999.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	paths, err := Discover(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || paths[0] != s.Path() {
		t.Fatalf("discovered %v, want [%s]", paths, s.Path())
	}
	resps, err := QueryAll(dir, Request{Op: OpStats, Host: "ipoib-h2"}, 5*time.Second)
	if err != nil || len(resps) != 1 || len(resps[0].Stats) != 1 {
		t.Fatalf("QueryAll: %+v, %v", resps, err)
	}
	if _, err := QueryAll(dir, Request{Op: OpStats, Host: "ipoib-h9"}, 5*time.Second); !errors.Is(err, ErrNoSuchHost) {
		t.Fatalf("QueryAll unknown host: %v, want ErrNoSuchHost", err)
	}
	if _, err := QueryAll(t.TempDir(), Request{Op: OpList}, time.Second); err == nil || !strings.Contains(err.Error(), "no running ipoib process") {
		t.Fatalf("QueryAll on empty dir: %v", err)
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"op":"list"}`))
	f.Add([]byte(`{"op":"mode","host":"h1","mode":"datagram"}`))
	f.Add([]byte(`{"op":"stats"} {}`))
	f.Add([]byte(`{"op":"child_add","host":"h1","child":{"pkey":32769,"name":"ib0.8001","addrs":["10.77.1.1/24"]}}`))
	f.Add([]byte(`{"op":"child_del","host":"h1","child":{"pkey":32768}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		switch r.Op {
		case OpList, OpStats, OpMode, OpCapture:
		case OpChildAdd, OpChildDel:
			if r.Child == nil || (r.Op == OpChildAdd && r.Child.PKey&0x7FFF == 0) || len(r.Child.Name) > 15 {
				t.Fatalf("accepted child request %+v", r.Child)
			}
		default:
			t.Fatalf("accepted op %q", r.Op)
		}
	})
}

func FuzzParseResponse(f *testing.F) {
	f.Add([]byte(`{"pid":1,"interfaces":[{"host":"h1","name":"ib0","mode":"connected","mtu":65520,"hwaddr":"","link_up":true}]}`))
	f.Add([]byte(`{"stats":[{"interface":{},"stats":{"Counters":{}}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseResponse(b) // must not panic
	})
}
