package cli

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// startUpNodes starts 'ipoib up' on hosts 127.79.<net>.1.., each with the
// options opts returns for it, all on one port.
func startUpNodes(t *testing.T, net byte, n int, opts func(k int, bind netip.AddrPort, binds []netip.Addr) UpOptions) []*upNode {
	t.Helper()
	var binds []netip.Addr
	for k := range n {
		binds = append(binds, netip.AddrFrom4([4]byte{127, 79, net, byte(k + 1)}))
	}
	port := borrowPort(t, binds[0])
	nodes := make([]*upNode, n)
	for k := range n {
		nodes[k] = startUpNode(t, opts(k, netip.AddrPortFrom(binds[k], port), binds), netip.AddrFrom4([4]byte{10, 79, net, byte(k + 1)}))
	}
	return nodes
}

// pingAll pings every ordered pair, all within one deadline.
func pingAll(t *testing.T, nodes []*upNode, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	errs := make(chan error, len(nodes)*len(nodes))
	pairs := 0
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			pairs++
			go func() {
				if err := a.ping(ctx, b.ip); err != nil {
					errs <- fmt.Errorf("%v -> %v: %w", a.ip, b.ip, err)
					return
				}
				errs <- nil
			}()
		}
	}
	for range pairs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// With --multicast=on (the default) hosts that know no peer reach each
// other: ARP goes to the broadcast group's IP group and the kernel
// delivers it to every host that joined (here all on lo).
func TestUpMulticastNoPeers(t *testing.T) {
	nodes := startUpNodes(t, 1, 4, func(_ int, bind netip.AddrPort, _ []netip.Addr) UpOptions {
		return upDefaults(bind, nil)
	})
	pingAll(t, nodes, 10*time.Second)
	for _, n := range nodes {
		if s := n.dev.Stats(); s.McastJoins == 0 || s.McastDelivered == 0 || s.GossipRequests != 0 {
			t.Errorf("%v: joins %d delivered %d gossip %d", n.ip, s.McastJoins, s.McastDelivered, s.GossipRequests)
		}
	}
}

// With --multicast=off hosts that know only host 1 reach each other, and
// so does a fifth knowing only host 3: the members gossip.
func TestUpGossipOneSeed(t *testing.T) {
	opts := func(k int, bind netip.AddrPort, binds []netip.Addr) UpOptions {
		var peers []netip.Addr
		switch {
		case k == 4:
			peers = binds[2:3]
		case k > 0:
			peers = binds[:1]
		}
		o := upDefaults(bind, peers)
		o.Multicast = false
		return o
	}
	nodes := startUpNodes(t, 2, 5, opts)
	pingAll(t, nodes, 10*time.Second)
	for _, n := range nodes {
		if s := n.dev.Stats(); s.McastJoins != 0 || len(n.dev.Members()) != 5 || s.GossipDropped != 0 {
			t.Errorf("%v: joins %d members %v gossip dropped %d", n.ip, s.McastJoins, n.dev.Members(), s.GossipDropped)
		}
	}
}

// A UDP multicast receiver gets the group's datagrams after it joins and
// stops getting them after it leaves, and not only at the host: its
// device leaves the IP group, so the network (here the kernel, which
// delivers a group only to sockets that joined it) no longer hands it the
// datagrams at all, while a member that stayed keeps getting them.
func TestUpMulticastJoinLeave(t *testing.T) {
	nodes := startUpNodes(t, 3, 3, func(_ int, bind netip.AddrPort, _ []netip.Addr) UpOptions {
		return upDefaults(bind, nil)
	})
	sender, leaver, stayer := nodes[0], nodes[1], nodes[2]
	group := netip.MustParseAddr("239.1.2.3") // MGID ff12:401b:ffff::f01:203, IP group 239.1.2.3
	type rx struct {
		who *upNode
		msg string
	}
	got := make(chan rx, 64)
	for _, n := range []*upNode{leaver, stayer} {
		if err := n.host.JoinMulticast(group); err != nil {
			t.Fatal(err)
		}
		c, err := n.host.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), 7000))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		go func() {
			buf := make([]byte, 2000)
			for {
				k, _, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				got <- rx{n, string(buf[:k])}
			}
		}()
	}
	s, err := sender.host.DialUDP(netip.AddrPortFrom(group, 7000))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Joins are asynchronous (IGMP report, attach, kernel join): resend
	// until both members have a copy.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(10 * time.Second)
	for have := map[*upNode]bool{}; len(have) < 2; {
		select {
		case <-tick.C:
			if _, err := s.Write([]byte("joined")); err != nil {
				t.Fatal(err)
			}
		case r := <-got:
			have[r.who] = true
		case <-timeout:
			t.Fatal("the members did not both get the group's datagrams")
		}
	}
	if !slices.Contains(leaver.dev.Groups(), group) {
		t.Fatalf("receiver's device groups %v, want %v among them", leaver.dev.Groups(), group)
	}

	if err := leaver.host.LeaveMulticast(group); err != nil {
		t.Fatal(err)
	}
	// The leave is asynchronous too (IGMP leave, detach, kernel leave).
	for slices.Contains(leaver.dev.Groups(), group) {
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("the receiver's device still holds %v after the host left", group)
		}
	}
	for len(got) > 0 {
		<-got // copies sent before the leave
	}
	before := leaver.dev.Stats()
	const n = 5
	for range n {
		if _, err := s.Write([]byte("after")); err != nil {
			t.Fatal(err)
		}
	}
	// The member that stayed gets all of them: they were sent.
	for stayed := 0; stayed < n; {
		select {
		case r := <-got:
			switch {
			case r.msg != "after": // a copy from before the leave, still in flight
			case r.who == leaver:
				t.Fatal("the receiver got a datagram sent after it left")
			default:
				stayed++
			}
		case <-timeout:
			t.Fatalf("the member that stayed got %d of %d", stayed, n)
		}
	}
	if after := leaver.dev.Stats(); after.Dropped(wire.DropNotAttached) != before.Dropped(wire.DropNotAttached) {
		t.Fatalf("the receiver's device still got the group's datagrams (not_attached %d -> %d)",
			before.Dropped(wire.DropNotAttached), after.Dropped(wire.DropNotAttached))
	}
}
