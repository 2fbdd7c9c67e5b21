package tap

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestCreateNetnsMarksAndBringsLoopbackUp(t *testing.T) {
	requireRoot(t)
	o := testOwner(t)
	n := createNetns(t, o, "lo")

	m, err := readMarker(o.markerPath(n.Name()))
	if err != nil {
		t.Fatalf("marker: %v", err)
	}
	if m.PID != os.Getpid() || !processAlive(m) {
		t.Fatalf("marker %+v does not name this live process (pid %d)", m, os.Getpid())
	}
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatalf("lo: %v", err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("lo flags %v, want up", lo.Attrs().Flags)
	}
	if _, err := o.Create(n.Name()); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second Create of %s: %v, want ErrExist", n.Name(), err)
	}
	name := n.Name()
	if err := n.Delete(); err != nil {
		t.Fatalf("delete: %v", err)
	}
	assertNetnsGone(t, o, name)
}

func TestCleanupStaleRemovesOnlyDeadOwners(t *testing.T) {
	requireRoot(t)
	o := testOwner(t)

	// A pid that existed and is gone: a child we ran and reaped.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true(1) to obtain a dead pid: %v", err)
	}
	deadPID := cmd.Process.Pid
	me, err := selfMarker()
	if err != nil {
		t.Fatal(err)
	}

	live := createNetns(t, o, "live")
	deadPid := createNetns(t, o, "deadpid")
	reused := createNetns(t, o, "reused")
	unmarked := createNetns(t, o, "unmarked")

	write := func(n *Netns, m ownerMarker) {
		if err := os.WriteFile(o.markerPath(n.Name()), m.marshal(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(deadPid, ownerMarker{PID: deadPID, Start: 1})
	write(reused, ownerMarker{PID: me.PID, Start: me.Start + 1}) // our pid, another process's start time
	if err := os.Remove(o.markerPath(unmarked.Name())); err != nil {
		t.Fatal(err)
	}
	// The unmarked namespace is not ours any more: clean it up by hand.
	t.Cleanup(func() {
		unmarked.Close()
		if err := netns.DeleteNamed(unmarked.Name()); err != nil {
			t.Errorf("removing unmarked test netns: %v", err)
		}
	})
	// A marker-directory file that is not a marker must be ignored.
	if err := os.WriteFile(filepath.Join(o.markerDir(), "garbage"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}

	removed, err := o.CleanupStale()
	if err != nil {
		t.Fatalf("CleanupStale: %v", err)
	}
	slices.Sort(removed)
	want := []string{deadPid.Name(), reused.Name()}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	deadPid.Close()
	reused.Close()
	assertNetnsGone(t, o, deadPid.Name())
	assertNetnsGone(t, o, reused.Name())
	for _, n := range []*Netns{live, unmarked} {
		if _, err := os.Stat(filepath.Join(netnsDir, n.Name())); err != nil {
			t.Errorf("netns %s was removed: %v", n.Name(), err)
		}
	}
	if _, err := os.Stat(filepath.Join(o.markerDir(), "garbage")); err != nil {
		t.Errorf("non-marker file removed: %v", err)
	}
	if err := unmarked.Delete(); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Delete of unmarked netns: %v, want ErrNotOwner", err)
	}
}

func TestVethPairCarriesTCP(t *testing.T) {
	requireRoot(t)
	o := testOwner(t)
	a := createNetns(t, o, "va")
	b := createNetns(t, o, "vb")
	addrA := netip.MustParsePrefix("10.98.0.1/24")
	addrB := netip.MustParsePrefix("10.98.0.2/24")
	err := CreateVethPair(a, "veth-a", LinkConfig{MTU: 9000, Addrs: []netip.Prefix{addrA}, Up: true},
		b, "veth-b", LinkConfig{MTU: 9000, Addrs: []netip.Prefix{addrB}, Up: true})
	if err != nil {
		t.Fatalf("veth: %v", err)
	}
	h, err := b.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("veth-b")
	if err != nil {
		t.Fatalf("veth-b not in netns b: %v", err)
	}
	if l.Attrs().MTU != 9000 || l.Attrs().TxQLen != DefaultTxQueueLen {
		t.Fatalf("veth-b mtu %d txqlen %d, want 9000 %d", l.Attrs().MTU, l.Attrs().TxQLen, DefaultTxQueueLen)
	}

	// Sockets belong to the namespace of the thread that creates them.
	var ln net.Listener
	if err := b.Do(func() (err error) {
		ln, err = net.Listen("tcp", addrB.Addr().String()+":0")
		return err
	}); err != nil {
		t.Fatalf("listen in b: %v", err)
	}
	defer ln.Close()
	accepted := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		defer c.Close()
		got, _ := io.ReadAll(c)
		accepted <- got
	}()
	var c net.Conn
	if err := a.Do(func() (err error) {
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		t.Fatalf("dial from a: %v", err)
	}
	msg := []byte("across the veth pair")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := <-accepted; string(got) != string(msg) {
		t.Fatalf("received %q, want %q", got, msg)
	}
	// The root namespace must not see either end.
	if _, err := netlink.LinkByName("veth-a"); err == nil {
		t.Fatal("veth-a visible in the root namespace")
	}
}
