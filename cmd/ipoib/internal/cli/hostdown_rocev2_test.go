package cli

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/rocev2"
)

// logEvents is a slog handler that signals each message containing want.
type logEvents struct {
	want string
	hit  chan struct{}
}

func (l *logEvents) Enabled(context.Context, slog.Level) bool { return true }
func (l *logEvents) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, l.want) {
		select {
		case l.hit <- struct{}{}:
		default:
		}
	}
	return nil
}
func (l *logEvents) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logEvents) WithGroup(string) slog.Handler      { return l }

// TestUpHostDownOverRoCEv2 is the host-down contract on the RoCEv2 device
// of 'ipoib up', counted at the UDP socket: once host 0's connections
// are gone, every datagram it sends while host 1 keeps pinging is a CM
// MAD (REJ INVALID_SERVICE_ID, or the DREP of a disconnect in flight),
// and after up, ping and TCP work again.
func TestUpHostDownOverRoCEv2(t *testing.T) {
	ev := &logEvents{want: "every connection is gone", hit: make(chan struct{}, 1)}
	p := newUpPairLog(t, rocev2.Faults{}, [2]hca.MTU{}, slog.New(ev))
	p.transfer(t, 1<<20)
	p.ping(t, 1, 56)
	down := p.ups[0].ifc
	if err := down.FollowHostLink(false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev.hit:
	case <-time.After(10 * time.Second):
		t.Fatalf("connections not gone 10 s after down: %+v", down.Stats())
	}
	st0, dev0 := down.Stats(), p.devs[0].Stats()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if _, err := p.hosts[1].Ping(ctx, p.addrs[0], 56); err == nil {
			t.Fatal("ping reached a host whose ib0 is down")
		}
		cancel()
	}
	st1, dev1 := down.Stats(), p.devs[0].Stats()
	mads := func(s map[string]uint64) (n uint64) {
		for _, v := range s {
			n += v
		}
		return n
	}
	sent0, sent1 := map[string]uint64{}, map[string]uint64{}
	for k, v := range st0.CM.Sent {
		sent0[k.String()] = v
	}
	for k, v := range st1.CM.Sent {
		sent1[k.String()] = v
	}
	datagrams, cmMADs := dev1.TxPackets-dev0.TxPackets, mads(sent1)-mads(sent0)
	rej := sent1["REJ"] - sent0["REJ"]
	drep := sent1["DREP"] - sent0["DREP"]
	invalid := st1.CM.RejSent[cm.RejectInvalidServiceID] - st0.CM.RejSent[cm.RejectInvalidServiceID]
	if datagrams != cmMADs || rej == 0 || invalid != rej || cmMADs != rej+drep {
		t.Fatalf("while down: %d datagrams sent, %d CM MADs (%d REJ, %d of them INVALID_SERVICE_ID, %d DREP); want only REJ INVALID_SERVICE_ID and DREP MADs, at least one REJ",
			datagrams, cmMADs, rej, invalid, drep)
	}
	if err := down.FollowHostLink(true); err != nil {
		t.Fatal(err)
	}
	p.ping(t, 0, 56)
	p.ping(t, 1, 56)
	p.transfer(t, 1<<20)
	if r := down.Stats().Reaper; r.HostDowns != 1 || r.HostUps != 1 || r.HostDownTXTeardowns != 1 || r.HostDownRXTeardowns != 1 {
		t.Fatalf("reaper after down and up: %+v", r)
	}
}
