package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/testutil"
)

// inNetns runs fn on an OS thread inside namespace ns: sockets fn opens
// belong to ns for their life. The thread goes back to its namespace, or
// is retired by the runtime when that fails.
func inNetns(t *testing.T, ns string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.GetFromName(ns)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leave %s: %w (thread retired)", ns, err)
			return // locked: the runtime ends the thread
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	if err := <-errc; err != nil {
		t.Fatalf("in netns %s: %v", ns, err)
	}
}

// tcpAcross sends n random bytes over TCP from namespace from to addr
// (in namespace to) and checks that they arrive whole, within 30 s.
func tcpAcross(t *testing.T, from, to, addr string, n int) {
	t.Helper()
	var l net.Listener
	inNetns(t, to, func() (err error) {
		l, err = net.Listen("tcp4", addr+":0")
		return err
	})
	defer l.Close()
	data := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 12))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	var c net.Conn
	inNetns(t, from, func() (err error) {
		c, err = net.DialTimeout("tcp4", l.Addr().String(), 10*time.Second)
		return err
	})
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(data); err != nil {
		c.Close()
		t.Fatalf("TCP %s -> %s: %v", from, addr, err)
	}
	c.Close()
	if b := <-got; !bytes.Equal(b, data) {
		t.Fatalf("TCP %s -> %s: %d of %d bytes arrived intact", from, addr, len(b), n)
	}
}

// hostStats is the engine's part of 'ipoib show --json' for host.
func hostStats(t *testing.T, ctl, host string) (control.InterfaceInfo, map[string]any) {
	t.Helper()
	r := runIpoib(t, "show", "--json", "--control-dir", ctl)
	var all []control.InterfaceStats
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		t.Fatalf("show --json: exit %d, %v: %s", r.code, err, short(r.stdout+r.stderr))
	}
	for _, s := range all {
		if s.Interface.Host == host {
			var m map[string]any
			if err := json.Unmarshal(s.Stats, &m); err != nil {
				t.Fatal(err)
			}
			return s.Interface, m
		}
	}
	t.Fatalf("show lists no %s", host)
	return control.InterfaceInfo{}, nil
}

// linkLocalOf is ns's ib0 link-local address (fe80::/64).
func linkLocalOf(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "-6", "-j", "addr", "show", "dev", "ib0").Output()
	if err != nil {
		t.Fatalf("ip -n %s addr: %v", ns, err)
	}
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
			Scope string `json:"scope"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Scope == "link" {
				return a.Local
			}
		}
	}
	t.Fatalf("%s ib0 has no link-local address: %s", ns, out)
	return ""
}

// TestBinaryHostDownStopsEngine: `ip link set ib0 down` on one host of a
// fabric stops its engine as Linux's ipoib_stop does: every connection
// torn down (counted), show says DOWN and host_link down. While the other
// host keeps pinging, the down host sends nothing on its QPs (tx_packets
// flat) and its CM only answers: REJ INVALID_SERVICE_ID to each REQ (and
// DREP to a DREQ still in flight). After `ip link set ib0 up`, ping and a
// checked TCP transfer work again both ways, each waited for on its own
// reply within a bound.
func TestBinaryHostDownStopsEngine(t *testing.T) {
	needPing(t)
	const nsPrefix = "ipoib-t12d"
	h1, h2 := nsPrefix+"1", nsPrefix+"2"
	a1, a2 := "10.77.95.1", "10.77.95.2"
	ctl := t.TempDir()
	checkGone(t, nsPrefix, ctl)
	fab := startDaemon(t, "stop with Ctrl-C", "fabric", "--hosts", "2", "--netns-prefix", nsPrefix, "--prefix", "10.77.95.0/24",
		"--control-dir", ctl)
	ping := func(from, to string, args ...string) error {
		return exec.Command("ip", append([]string{"netns", "exec", from, "ping"}, append(args, to)...)...).Run()
	}
	if err := ping(h1, a2, "-c", "1", "-w", "10"); err != nil {
		t.Fatalf("ping before down: %v", err)
	}
	tcpAcross(t, h1, h2, a2, 1<<20)
	tcpAcross(t, h2, h1, a1, 1<<20)
	_, before := hostStats(t, ctl, h2)
	if tx, rx := len(before["tx_conns"].([]any)), len(before["rx_conns"].([]any)); tx == 0 || rx == 0 {
		t.Fatalf("before down: %d TX, %d RX connections on %s; want some of each", tx, rx, h2)
	}

	ll := linkLocalOf(t, h2)
	ipIn(t, h2, "link", "set", "ib0", "down")
	if !fab.waitLog("host down: every connection is gone") {
		t.Fatalf("no 'every connection is gone' within 10 s of down\n%s", fab.output())
	}
	info, down := hostStats(t, ctl, h2)
	if info.LinkUp || down["host_link"] != "down" || len(down["tx_conns"].([]any))+len(down["rx_conns"].([]any)) != 0 {
		t.Fatalf("after down: link_up %v host_link %v, %d TX %d RX connections", info.LinkUp, down["host_link"],
			len(down["tx_conns"].([]any)), len(down["rx_conns"].([]any)))
	}
	if testutil.JSONNumber(t, down, "reaper", "host_downs") != 1 || testutil.JSONNumber(t, down, "reaper", "host_down_tx_teardowns") == 0 ||
		testutil.JSONNumber(t, down, "reaper", "host_down_rx_teardowns") == 0 {
		t.Fatalf("down counters: %v", down["reaper"])
	}
	if len(info.Notes) == 0 || !strings.Contains(info.Notes[len(info.Notes)-1], "down") {
		t.Errorf("no note saying the host set ib0 down: %q", info.Notes)
	}

	// h1 keeps trying: its kernel still has h2 in its ARP cache.
	if err := ping(h1, a2, "-c", "3", "-i", "0.2", "-W", "1"); err == nil {
		t.Fatal("ping reached a host whose ib0 is down")
	}
	_, after := hostStats(t, ctl, h2)
	if a, b := testutil.JSONNumber(t, after, "counters", "tx_packets"), testutil.JSONNumber(t, down, "counters", "tx_packets"); a != b {
		t.Errorf("tx_packets of the down host moved: %v -> %v", b, a)
	}
	for _, typ := range []string{"REQ", "REP", "RTU", "DREQ", "MRA"} {
		if a, b := testutil.JSONNumber(t, after, "cm", "sent", typ), testutil.JSONNumber(t, down, "cm", "sent", typ); a != b {
			t.Errorf("the down host's CM sent %v %s", a-b, typ)
		}
	}
	rej := testutil.JSONNumber(t, after, "cm", "rej_sent", "INVALID_SERVICE_ID") - testutil.JSONNumber(t, down, "cm", "rej_sent", "INVALID_SERVICE_ID")
	if rej == 0 {
		t.Error("h1's REQs got no REJ INVALID_SERVICE_ID from the down host")
	}
	_, peer := hostStats(t, ctl, h1)
	if testutil.JSONNumber(t, peer, "cm", "rej_received", "INVALID_SERVICE_ID") == 0 {
		t.Error("h1 received no REJ INVALID_SERVICE_ID")
	}

	ipIn(t, h2, "link", "set", "ib0", "up")
	if !fab.waitLog("host set the interface up: running") {
		t.Fatalf("no 'up: running' within 10 s of up\n%s", fab.output())
	}
	// -w 10: ping waits up to 10 s for the first reply, one echo a second.
	if err := ping(h1, a2, "-c", "1", "-w", "10"); err != nil {
		t.Fatalf("ping h1 -> h2 after up: %v\n%s", err, fab.output())
	}
	if err := ping(h2, a1, "-c", "1", "-w", "10"); err != nil {
		t.Fatalf("ping h2 -> h1 after up: %v", err)
	}
	// The kernel flushed h2's IPv6 addresses on down; its link-local from
	// the port GID is back after up, and answers.
	if err := ping(h1, ll+"%ib0", "-6", "-c", "1", "-w", "10"); err != nil {
		t.Fatalf("ping6 h1 -> %s (h2's link-local) after down and up: %v", ll, err)
	}
	tcpAcross(t, h1, h2, a2, 1<<20)
	tcpAcross(t, h2, h1, a1, 1<<20)
	info, up := hostStats(t, ctl, h2)
	if !info.LinkUp || up["host_link"] != "up" || testutil.JSONNumber(t, up, "reaper", "host_ups") != 1 || len(up["tx_conns"].([]any)) == 0 {
		t.Errorf("after up: link_up %v host_link %v host_ups %v, %d TX connections", info.LinkUp, up["host_link"],
			testutil.JSONNumber(t, up, "reaper", "host_ups"), len(up["tx_conns"].([]any)))
	}
	if st := fab.stop(); st.ExitCode() != 0 {
		t.Errorf("fabric exit %d", st.ExitCode())
	}
	checkGone(t, nsPrefix, ctl)
}
