package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/tap"
)

// showByName is 'ipoib show --json' of ctl, by host/interface.
func showByName(t *testing.T, ctl string) map[string]control.InterfaceStats {
	t.Helper()
	r := runIpoib(t, "show", "--json", "--control-dir", ctl)
	var all []control.InterfaceStats
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		t.Fatalf("show --json: exit %d, %v: %s", r.code, err, short(r.stdout+r.stderr))
	}
	m := map[string]control.InterfaceStats{}
	for _, s := range all {
		m[s.Interface.Host+"/"+s.Interface.Name] = s
	}
	return m
}

// txBytes is an interface's tx_bytes in a show --json snapshot.
func txBytes(t *testing.T, s control.InterfaceStats) uint64 {
	t.Helper()
	var st struct {
		Counters struct {
			TxBytes uint64 `json:"tx_bytes"`
		} `json:"counters"`
	}
	if err := json.Unmarshal(s.Stats, &st); err != nil {
		t.Fatal(err)
	}
	return st.Counters.TxBytes
}

// rxWrongPKey is an interface's rx_wrong_pkey in a show --json snapshot.
func rxWrongPKey(t *testing.T, s control.InterfaceStats) uint64 {
	t.Helper()
	var st struct {
		Counters struct {
			RxWrongPKey uint64 `json:"rx_wrong_pkey"`
		} `json:"counters"`
	}
	if err := json.Unmarshal(s.Stats, &st); err != nil {
		t.Fatal(err)
	}
	return st.Counters.RxWrongPKey
}

// tcpBetween sends n random bytes over TCP from namespace from to dst
// (listening in namespace to) through the kernel and the TAPs, and checks
// they arrive intact. Sockets made inside a namespace stay in it.
func tcpBetween(from, to, dst string, n int) error {
	owner := &tap.Owner{}
	nsFrom, err := owner.Open(from)
	if err != nil {
		return err
	}
	defer nsFrom.Close()
	nsTo, err := owner.Open(to)
	if err != nil {
		return err
	}
	defer nsTo.Close()
	var ln net.Listener
	if err := nsTo.Do(func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(dst, "0")); return err }); err != nil {
		return err
	}
	defer ln.Close()
	sum := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		c, err := ln.Accept()
		if err == nil {
			c.SetDeadline(time.Now().Add(60 * time.Second))
			io.Copy(h, c)
			c.Close()
		}
		var s [32]byte
		copy(s[:], h.Sum(nil))
		sum <- s
	}()
	var c net.Conn
	if err := nsFrom.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
		return err
	}); err != nil {
		return err
	}
	data := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n)}).Read(data)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	_, werr := io.Copy(c, bytes.NewReader(data))
	c.Close()
	if werr != nil {
		return fmt.Errorf("send to %s: %w", dst, werr)
	}
	if got := <-sum; got != sha256.Sum256(data) {
		return fmt.Errorf("%d bytes to %s arrived changed", n, dst)
	}
	return nil
}

// TestBinaryPartitions: 'ipoib fabric --partition' puts hosts 1 and 2
// into 0x8001 as full members and 4 and 5 as limited ones (a child
// ib0.8001 each, on 10.77.x.0/24 after --prefix), 'ipoib child add' puts
// host 3 into 0x8002 on the same IP subnet. 1 and 2 ping and move TCP
// over the child; 3 reaches neither; limited 4 reaches full 1 but not
// limited 5, whose port counts the wrong P_Key; child and parent
// carry traffic at the same time, each counted on its own interface;
// bad child requests cost one line and create nothing; child del removes
// the TAP.
func TestBinaryPartitions(t *testing.T) {
	needPing(t)
	const nsPrefix = "ipoib-t13c"
	h1, h2, h3, h4, h5 := nsPrefix+"1", nsPrefix+"2", nsPrefix+"3", nsPrefix+"4", nsPrefix+"5"
	ctl := t.TempDir()
	checkGone(t, nsPrefix, ctl)
	fab := startDaemon(t, "stop with Ctrl-C", "fabric", "--hosts", "5", "--netns-prefix", nsPrefix, "--prefix", "10.77.80.0/24",
		"--partition", "0x8001=1,2,4:limited,5:limited", "--control-dir", ctl)
	ping := func(from, to string) error {
		return exec.Command("ip", "netns", "exec", from, "ping", "-c", "1", "-W", "2", to).Run()
	}

	r := runIpoib(t, "child", "add", "--host", h3, "--addr", "10.77.81.3/24", "--control-dir", ctl, "0x8002")
	if r.code != 0 || r.stdout != h3+": ib0.8002: pkey 0x8002 membership full parent ib0 added\n" {
		t.Fatalf("child add: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	before := showByName(t, ctl)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--host", h3, "0x8002"}, 1, "partition 0x8002 has ib0.8002 already"},
		{[]string{"--host", h3, "0x0002"}, 1, "partition 0x8002 has ib0.8002 already"},
		{[]string{"--host", h3, "0xffff"}, 1, "partition 0xffff is ib0's own"},
		{[]string{"--host", h3, "0x0000"}, 2, "0x0000 and 0x8000 are not partitions"},
		{[]string{"--host", h3, "0x8000"}, 2, "0x0000 and 0x8000 are not partitions"},
		{[]string{"--host", h3, "0x10000"}, 2, "want a P_Key like 0x8001"},
		{[]string{"--host", h3, "--name", "ib0.8003-too-long", "0x8003"}, 2, "--name \"ib0.8003-too-long\""},
		{[]string{"--host", h3, "--addr", "10.77.81.3", "0x8003"}, 2, "--addr \"10.77.81.3\""},
		{[]string{"--host", nsPrefix + "9", "0x8003"}, 1, "no such host"},
		{[]string{"0x8003"}, 1, "5 hosts run"},
	} {
		args := append([]string{"child", "add", "--control-dir", ctl}, tc.args...)
		r := runIpoib(t, args...)
		if r.code != tc.code || !oneLine(r.stderr) || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("ipoib %v: exit %d stderr %q stdout %q; want %d and one line naming %q", args, r.code, r.stderr, r.stdout, tc.code, tc.want)
		}
	}
	after := showByName(t, ctl)
	if len(after) != len(before) || len(after) != 10 {
		t.Fatalf("interfaces %d before the bad requests, %d after; want 10", len(before), len(after))
	}
	for _, ns := range []string{h1, h2, h3} {
		out, _ := exec.Command("ip", "-n", ns, "-br", "link").Output()
		if n := strings.Count(string(out), "ib0"); n != 2 {
			t.Errorf("%s has %d ib0 devices, want 2:\n%s", ns, n, out)
		}
	}

	// show lists the children with P_Key and membership, in every view.
	for key, want := range map[string][3]string{
		h1 + "/ib0": {"0xffff", "full", ""}, h1 + "/ib0.8001": {"0x8001", "full", "ib0"},
		h2 + "/ib0.8001": {"0x8001", "full", "ib0"}, h3 + "/ib0.8002": {"0x8002", "full", "ib0"},
		h4 + "/ib0.8001": {"0x8001", "limited", "ib0"},
	} {
		i := after[key].Interface
		if i.PKey != want[0] || i.Membership != want[1] || i.Parent != want[2] || !i.LinkUp {
			t.Errorf("%s: pkey %q membership %q parent %q up %v; want %v up", key, i.PKey, i.Membership, i.Parent, i.LinkUp, want)
		}
	}
	r = runIpoib(t, "show", "--brief", "--control-dir", ctl)
	if !strings.Contains(r.stdout, "PKEY") || !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), h3+" ib0.8002 0x8002 full connected 65520 UP") {
		t.Errorf("show --brief:\n%s", r.stdout)
	}
	r = runIpoib(t, "show", "--host", h2, "--dev", "ib0.8001", "--control-dir", ctl)
	if !strings.Contains(r.stdout, h2+": ib0.8001: <UP>") || !strings.Contains(r.stdout, "pkey 0x8001 membership full parent ib0") ||
		!strings.Contains(r.stdout, "inet 10.77.81.2/24") || strings.Contains(r.stdout, h2+": ib0:") {
		t.Errorf("show --dev ib0.8001:\n%s", r.stdout)
	}

	// Hosts in 0x8001 reach each other; the host in 0x8002 reaches
	// neither, though it is on their IP subnet.
	if err := ping(h1, "10.77.81.2"); err != nil {
		t.Fatalf("ping h1 -> h2 in 0x8001: %v\n%s", err, fab.output())
	}
	if err := ping(h3, "10.77.81.1"); err == nil {
		t.Error("h3 in 0x8002 reached h1 in 0x8001")
	}
	if err := ping(h1, "10.77.81.3"); err == nil {
		t.Error("h1 in 0x8001 reached h3 in 0x8002")
	}
	// A limited member talks to a full one, not to another limited one.
	if err := ping(h4, "10.77.81.1"); err != nil {
		t.Errorf("limited h4 -> full h1: %v", err)
	}
	if err := ping(h4, "10.77.81.5"); err == nil {
		t.Error("limited h4 reached limited h5")
	}
	// h4's ARP reached h5's port (the broadcast group is the
	// partition's), which dropped it: two limited members.
	if n := rxWrongPKey(t, showByName(t, ctl)[h5+"/ib0.8001"]); n == 0 {
		t.Error("limited h5 counted no wrong-P_Key packets from limited h4")
	}

	// The child alone carries a transfer: its counters move, not the
	// parent's; then child and parent at the same time, both intact.
	const size = 8 << 20
	if err := ping(h1, "10.77.80.2"); err != nil {
		t.Fatalf("ping h1 -> h2 over ib0: %v", err)
	}
	s0 := showByName(t, ctl)
	if err := tcpBetween(h1, h2, "10.77.81.2", size); err != nil {
		t.Fatalf("TCP over ib0.8001: %v", err)
	}
	s1 := showByName(t, ctl)
	child := txBytes(t, s1[h1+"/ib0.8001"]) - txBytes(t, s0[h1+"/ib0.8001"])
	parent := txBytes(t, s1[h1+"/ib0"]) - txBytes(t, s0[h1+"/ib0"])
	if child < size || parent > size/16 {
		t.Errorf("child transfer of %d bytes: child tx +%d, parent tx +%d", size, child, parent)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for k, dst := range []string{"10.77.80.2", "10.77.81.2"} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[k] = tcpBetween(h1, h2, dst, size) }()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Errorf("concurrent transfer %d: %v", k, err)
		}
	}
	s2 := showByName(t, ctl)
	for _, name := range []string{"ib0", "ib0.8001"} {
		if d := txBytes(t, s2[h1+"/"+name]) - txBytes(t, s1[h1+"/"+name]); d < size {
			t.Errorf("%s tx moved %d bytes in the concurrent transfers, want >= %d", name, d, size)
		}
	}

	// del by P_Key removes the TAP; a second del is one clear line.
	r = runIpoib(t, "child", "del", "--host", h3, "--control-dir", ctl, "0x8002")
	if r.code != 0 || r.stdout != h3+": ib0.8002: pkey 0x8002 membership full parent ib0 deleted\n" {
		t.Fatalf("child del: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if err := exec.Command("ip", "-n", h3, "link", "show", "ib0.8002").Run(); err == nil {
		t.Error("ib0.8002 still in the kernel after child del")
	}
	r = runIpoib(t, "child", "del", "--host", h3, "--control-dir", ctl, "ib0.8002")
	if r.code != 1 || !oneLine(r.stderr) || !strings.Contains(r.stderr, "has no child ib0.8002") {
		t.Errorf("second del: exit %d stderr %q", r.code, r.stderr)
	}
	if _, ok := showByName(t, ctl)[h3+"/ib0.8002"]; ok {
		t.Error("show lists the deleted child")
	}
	if st := fab.stop(); !st.Success() {
		t.Errorf("fabric exit %v\n%s", st, fab.output())
	}
	checkGone(t, nsPrefix, ctl)
}
