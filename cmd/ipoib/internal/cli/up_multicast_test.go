package cli

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
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
