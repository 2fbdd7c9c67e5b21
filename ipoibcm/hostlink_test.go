package ipoibcm

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// fabricCounter counts what each device puts on the soft fabric, split
// into CM MADs (from QP 1) and everything else: the wire's view of who
// sends what.
type fabricCounter struct {
	mu   sync.Mutex
	mads map[string]int
	data map[string]int
}

func (c *fabricCounter) Message(m *soft.Message) {
	if m.Kind == soft.MessageRNRNak {
		return // the responder's NAK, not a send of its own
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.SrcQPN == hca.QPNGSI {
		c.mads[m.SrcDev]++
	} else {
		c.data[m.SrcDev]++
	}
}

func (c *fabricCounter) sent(dev string) (mads, data int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mads[dev], c.data[dev]
}

// TestHostDownStopsAndUpRestarts: `ip link set ib0 down` on node 0 takes
// its engine down as ipoib_stop does. Every TX and passive connection is
// torn down (counted), neighbours and multicast groups are flushed, the
// link shows down. While node 1 keeps pinging, node 0 puts nothing on the
// fabric but the CM's REJ INVALID_SERVICE_ID to each of node 1's REQs;
// node 1's UD fallback is dropped as rx_link_down, node 0's own host
// frames as tx_link_down. After `up` ping and TCP work again both ways.
func TestHostDownStopsAndUpRestarts(t *testing.T) {
	fc := &fabricCounter{mads: map[string]int{}, data: map[string]int{}}
	quiet := make(chan struct{}, 1)
	tn := newTestNet(t, 2, soft.Config{Tap: fc}, func(k int, c *Config) {
		if k == 0 {
			// The engine says when, with the host's ib0 down, its last
			// connection is gone.
			c.Logger = slog.New(logSignal{msg: "host down: every connection is gone", ch: quiet})
		}
	})
	a, b := tn.nodes[0], tn.nodes[1]

	tcpTransfer(t, a, b, b.v4, 1<<20, nil)
	ping(t, b, a.v4, 56)
	before := a.ifc.Stats()
	if len(before.TXConns) != 1 || len(before.RXConns) != 1 || len(before.Neighbours) != 1 {
		t.Fatalf("before down: %d TX, %d RX connections, %d neighbours; want 1 each", len(before.TXConns), len(before.RXConns), len(before.Neighbours))
	}

	if err := a.ifc.FollowHostLink(false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-quiet:
	case <-time.After(10 * time.Second):
		t.Fatalf("connections not gone 10 s after down: %+v", a.ifc.Stats())
	}
	down := a.ifc.Stats()
	r := down.Reaper
	if down.HostLink != "down" || down.LinkUp || len(down.TXConns)+len(down.RXConns) != 0 ||
		r.HostDowns != 1 || r.HostDownRXTeardowns != 1 || r.HostDownTXTeardowns != 1 || r.HostDownPathsFlushed != 1 {
		t.Fatalf("after down: host_link %q link_up %v, %d TX %d RX conns, reaper %+v",
			down.HostLink, down.LinkUp, len(down.TXConns), len(down.RXConns), r)
	}
	a.ifc.neigh.mu.Lock()
	for _, n := range a.ifc.neigh.byGID {
		if n.ah != nil || n.tx != nil || n.nParked != 0 {
			t.Errorf("neighbour %v keeps its path while down: AH %v, TX %v, %d parked", n.hw, n.ah != nil, n.tx != nil, n.nParked)
		}
	}
	a.ifc.mcast.mu.Lock()
	for mgid, g := range a.ifc.mcast.groups {
		if g.attached {
			t.Errorf("still attached to %v while down", mgid)
		}
	}
	a.ifc.mcast.mu.Unlock()
	a.ifc.neigh.mu.Unlock()

	// Node 1 keeps trying; node 0's host (a gVisor stack, which does not
	// know it is down) tries too.
	madsBefore, dataBefore := fc.sent("hca0")
	rejBefore := down.CM.RejSent[cm.RejectInvalidServiceID]
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if _, err := b.host.Ping(ctx, a.v4, 56); err == nil {
			t.Fatal("ping reached a host whose ib0 is down")
		}
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, _ = a.host.Ping(ctx, b.v4, 56)
		cancel()
	}
	mads, data := fc.sent("hca0")
	st := a.ifc.Stats()
	rej := st.CM.RejSent[cm.RejectInvalidServiceID] - rejBefore
	if data != dataBefore {
		t.Errorf("node 0 sent %d data messages on the fabric while down", data-dataBefore)
	}
	// The CM answers: REJ to each REQ, and DREP to the peer's DREQ that
	// may still finish the disconnects down started. It starts nothing.
	drep := st.CM.Sent[cm.MsgDREP] - down.CM.Sent[cm.MsgDREP]
	if rej == 0 || uint64(mads-madsBefore) != rej+drep {
		t.Errorf("node 0 sent %d CM MADs while down, %d REJ INVALID_SERVICE_ID and %d DREP; want only those, at least one REJ; sent %v -> %v",
			mads-madsBefore, rej, drep, down.CM.Sent, st.CM.Sent)
	}
	if st.Counters.TxPackets != down.Counters.TxPackets {
		t.Errorf("tx_packets moved while down: %d -> %d", down.Counters.TxPackets, st.Counters.TxPackets)
	}
	if st.Drops["tx_link_down"] == 0 {
		t.Error("tx_link_down 0: node 0's host frames while down were not counted")
	}
	if got := b.ifc.Stats().CM.RejReceived[cm.RejectInvalidServiceID]; got != rej {
		t.Errorf("node 1 received %d REJ INVALID_SERVICE_ID, node 0 sent %d", got, rej)
	}

	// In datagram mode node 1 sends unicast UD, which node 0 counts and
	// drops.
	if err := b.ifc.SetMode(ModeDatagram); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if _, err := b.host.Ping(ctx, a.v4, 56); err == nil {
			t.Fatal("ping over UD reached a host whose ib0 is down")
		}
		cancel()
	}
	if _, d := fc.sent("hca0"); d != dataBefore {
		t.Errorf("node 0 sent %d data messages on the fabric while down", d-dataBefore)
	}
	if n := a.ifc.Stats().Drops["rx_link_down"]; n == 0 {
		t.Error("rx_link_down 0 after node 1's UD pings")
	}
	if err := b.ifc.SetMode(ModeConnected); err != nil {
		t.Fatal(err)
	}

	if err := a.ifc.FollowHostLink(true); err != nil {
		t.Fatal(err)
	}
	up := a.ifc.Stats()
	if up.HostLink != "up" || !up.LinkUp || up.Reaper.HostUps != 1 {
		t.Fatalf("after up: host_link %q link_up %v host_ups %d", up.HostLink, up.LinkUp, up.Reaper.HostUps)
	}
	a.ifc.mcast.mu.Lock()
	for mgid, g := range a.ifc.mcast.groups {
		if g.state != mcastSendOnly && !g.attached {
			t.Errorf("%s group %v not attached again after up", g.state, mgid)
		}
	}
	a.ifc.mcast.mu.Unlock()
	ping(t, a, b.v4, 56)
	ping(t, b, a.v4, 56)
	tcpTransfer(t, a, b, b.v4, 1<<20, nil)
	tcpTransfer(t, b, a, a.v4, 1<<20, nil)
	if n := len(a.ifc.Stats().TXConns); n != 1 {
		t.Errorf("%d TX connections after up and a transfer; want 1 (connected mode again)", n)
	}
}

// logSignal is a slog.Handler that signals ch at each record whose
// message is msg (and drops every record).
type logSignal struct {
	msg string
	ch  chan<- struct{}
}

func (l logSignal) Enabled(context.Context, slog.Level) bool { return true }

func (l logSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == l.msg {
		select {
		case l.ch <- struct{}{}:
		default:
		}
	}
	return nil
}

func (l logSignal) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l logSignal) WithGroup(string) slog.Handler { return l }
