package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/cmd/ipoib/internal/config"
	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/proc"
	"github.com/ipoibcm/ipoib/internal/sdnotify"
	"github.com/ipoibcm/ipoib/metrics"
)

// upService is 'ipoib up' as a service: it tells the service manager
// when the interface is ready and what it does (internal/sdnotify),
// stops on request ('ipoib down') and applies a re-read config file
// (SIGHUP, 'ipoib reload') without tearing down what still fits. It is
// the control socket's control.Process.
type upService struct {
	host   *upHost
	m      *metrics.Metrics
	log    *slog.Logger
	notify *sdnotify.Notifier
	hangup <-chan os.Signal

	stop     chan struct{}
	stopOnce sync.Once

	// mu serialises reloads (a SIGHUP and an 'ipoib reload' at once)
	// and guards what they change.
	mu         sync.Mutex
	cur        UpOptions
	metricsSrv *metrics.Server
}

var _ control.Process = (*upService)(nil)

// statusEvery is how often the STATUS= line is refreshed while running,
// so 'systemctl status' shows connections that came and went.
const statusEvery = 10 * time.Second

func newUpService(o UpOptions, h *upHost, m *metrics.Metrics, log *slog.Logger) (*upService, error) {
	n, err := sdnotify.New(o.notify)
	if err != nil {
		return nil, err
	}
	s := &upService{host: h, m: m, log: log, notify: n, hangup: o.hangup, stop: make(chan struct{}), cur: o}
	if o.Metrics != "" {
		if err := s.serveMetrics(o.Metrics); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *upService) serveMetrics(addr string) error {
	ms, err := metrics.Serve(addr, s.m, s.log)
	if err != nil {
		return err
	}
	s.metricsSrv = ms
	s.log.Info("metrics", "url", "http://"+ms.Addr().String()+"/metrics")
	return nil
}

// run tells the service manager the interface is ready and serves until
// ctx ends, a stop is requested, or a hangup comes without a file to
// re-read; then it says it is stopping.
func (s *upService) run(ctx context.Context) {
	status := s.status()
	s.send(sdnotify.Ready, sdnotify.Status(status))
	tick := time.NewTicker(statusEvery)
	defer tick.Stop()
	peerTick := time.NewTicker(s.host.peers.period)
	defer peerTick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.send(sdnotify.Stopping)
			return
		case <-s.stop:
			s.send(sdnotify.Stopping)
			return
		case <-s.hangup:
			if s.cur.reload == nil || s.cur.ConfigPath == "" {
				s.log.Info("SIGHUP without --config: stopping")
				s.send(sdnotify.Stopping)
				return
			}
			if _, err := s.Reload(); err != nil {
				s.log.Error("reload", "err", oneLine(err))
			}
		case now := <-peerTick.C:
			s.host.peers.sample(now, s.host.ifc.Stats())
			continue
		case <-tick.C:
		}
		if now := s.status(); now != status {
			status = now
			s.send(sdnotify.Status(status))
		}
	}
}

func (s *upService) send(assignments ...string) {
	if !s.notify.Enabled() {
		return
	}
	if err := s.notify.Send(assignments...); err != nil {
		s.log.Warn("service manager notification", "err", err)
	}
}

// status is the one line 'systemctl status' shows: the mode, the
// address, the peers known and how many of them have a connection up.
func (s *upService) status() string {
	ifc := s.host.ifc
	st := ifc.Stats()
	connected := map[string]bool{}
	for _, c := range st.TXConns {
		if c.State == "up" {
			connected[c.PeerGID] = true
		}
	}
	peers := 0
	self := s.host.dev.LocalAddr().Addr()
	for _, a := range s.host.dev.Members() {
		if a != self {
			peers++
		}
	}
	return fmt.Sprintf("%s %s mode %s mtu %d, %d peers, %d connected, %d children",
		ifc.Name(), s.host.addrs[0], st.Mode, st.MTU, peers, len(connected), len(s.host.kids.endpoints()))
}

// Stop begins the orderly exit 'ipoib down' asked for.
func (s *upService) Stop() { s.stopOnce.Do(func() { close(s.stop) }) }

// Stopping says what the exit removes: the TAPs of ib0 and its children
// and, by the server, the control socket.
func (s *upService) Stopping() control.StopInfo {
	pid := os.Getpid()
	start, _ := proc.StartTime(pid)
	taps := []string{s.host.ifc.Name()}
	for _, k := range s.host.kids.endpoints() {
		taps = append(taps, k.Info().Name)
	}
	return control.StopInfo{PID: pid, Start: start, TAPs: taps}
}

func (s *upService) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.metricsSrv == nil {
		return nil
	}
	err := s.metricsSrv.Close()
	s.metricsSrv = nil
	return err
}

// Reload re-reads the file and applies what can change live: peers
// added, the allow list, the P_Key table and the children, the log
// level, the metrics address. Connections that still fit are left
// alone. What cannot change live is named and left as it was. A file
// with an error changes nothing.
func (s *upService) Reload() (control.ReloadResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var res control.ReloadResult
	if s.cur.reload == nil || s.cur.ConfigPath == "" {
		return res, errors.New("reload: this 'ipoib up' has no --config file to re-read")
	}
	s.send(sdnotify.Reloading)
	// READY=1 again ends the reload; the status is the one after it.
	defer func() { s.send(sdnotify.Ready, sdnotify.Status(s.status())) }()
	next, err := s.cur.reload()
	if err != nil {
		return res, fmt.Errorf("%w (nothing changed)", err)
	}
	res.NotLive = notLive(s.cur, next)
	applied, err := s.apply(next)
	res.Applied = applied
	if len(res.NotLive) > 0 {
		s.log.Warn("reload: these keys cannot change while running; restart to apply them", "keys", strings.Join(res.NotLive, ","))
	}
	s.log.Info("reloaded", "config", s.cur.ConfigPath, "applied", strings.Join(applied, "; "))
	return res, err
}

// apply makes the live-changeable settings of next true, one step at a
// time; it stops at the first step that fails, reporting what it did.
func (s *upService) apply(next UpOptions) (applied []string, _ error) {
	cur := &s.cur
	dev := s.host.dev
	var added, gone []netip.Addr
	for _, p := range next.Peers {
		if !slices.Contains(cur.Peers, p) {
			added = append(added, p)
		}
	}
	for _, p := range cur.Peers {
		if !slices.Contains(next.Peers, p) {
			gone = append(gone, p)
		}
	}
	for _, p := range added {
		dev.AddPeer(p)
		cur.Peers = append(cur.Peers, p)
	}
	if len(added) > 0 {
		applied = append(applied, fmt.Sprintf("peers added %v", added))
	}
	if len(gone) > 0 {
		// A member stays one until it goes quiet; the device has no way
		// to forget one it was told of.
		applied = append(applied, fmt.Sprintf("peers %v removed from the file stay members until restart", gone))
	}
	if !slices.Equal(next.Allow, cur.Allow) || len(added) > 0 && next.Allow == nil {
		allow := next.Allow
		if allow == nil {
			var err error
			if allow, err = defaultAllow(cur.Bind.Addr(), cur.Peers); err != nil {
				return applied, err
			}
		}
		if !slices.Equal(allow, dev.Allow()) {
			if err := dev.SetAllow(allow); err != nil {
				return applied, err
			}
			applied = append(applied, fmt.Sprintf("allow %v", allow))
		}
		cur.Allow = next.Allow
	}
	if next.LogLevel != cur.LogLevel {
		cur.level.Set(next.LogLevel)
		cur.LogLevel = next.LogLevel
		applied = append(applied, "log-level "+strings.ToLower(next.LogLevel.String()))
	}
	if next.Metrics != cur.Metrics {
		if s.metricsSrv != nil {
			if err := s.metricsSrv.Close(); err != nil {
				return applied, err
			}
			s.metricsSrv = nil
		}
		if next.Metrics != "" {
			if err := s.serveMetrics(next.Metrics); err != nil {
				cur.Metrics = ""
				return applied, err
			}
		}
		cur.Metrics = next.Metrics
		applied = append(applied, fmt.Sprintf("metrics %q", next.Metrics))
	}
	kids, err := s.applyPartitions(next)
	return append(applied, kids...), err
}

// applyPartitions brings the children and the port's P_Key table to
// next's: children gone from the file (or changed) are deleted first,
// then the table is rewritten, then new children are made. Entries keep
// their index, which the running QPs send with: an entry removed from
// the middle of the table would move the ones after it, so that is left
// for a restart.
func (s *upService) applyPartitions(next UpOptions) (applied []string, _ error) {
	cur := &s.cur
	kids := &s.host.kids
	var keep []config.Child
	for _, c := range cur.Children {
		if slices.ContainsFunc(next.Children, func(n config.Child) bool { return sameChild(c, n) }) {
			keep = append(keep, c)
			continue
		}
		if err := kids.del(c.Name); err != nil {
			return applied, fmt.Errorf("child %s: %w", c.Name, err)
		}
		applied = append(applied, "child deleted "+c.Name)
	}
	cur.Children = keep
	dev := s.host.dev
	table, ok := grownTable(dev.Port().PKeys, upPKeyTable(next.PKey, next.PKeyTable))
	if !ok {
		applied = append(applied, "pkey-table: an entry removed before others in use stays until restart")
	} else if !slices.Equal(table, dev.Port().PKeys) {
		if err := dev.SetPKeyTable(table); err != nil {
			return applied, err
		}
		cur.PKeyTable = next.PKeyTable
		applied = append(applied, "pkey-table "+pkeyList(table))
	}
	for _, c := range next.Children {
		if slices.ContainsFunc(cur.Children, func(k config.Child) bool { return sameChild(c, k) }) {
			continue
		}
		if _, err := kids.add(childRequest(c)); err != nil {
			return applied, fmt.Errorf("%s:%d: child %s: %w", cur.ConfigPath, c.Line, c.Name, err)
		}
		cur.Children = append(cur.Children, c)
		applied = append(applied, "child added "+c.Name)
	}
	return applied, nil
}

// grownTable is the P_Key table want laid over have without moving an
// entry: entries of both keep their index (with want's membership bit),
// new ones are appended, and trailing entries want lacks are dropped.
// false: want lacks an entry that others follow.
func grownTable(have, want []hca.PKey) ([]hca.PKey, bool) {
	same := func(a, b hca.PKey) bool { return a&0x7FFF == b&0x7FFF }
	out := make([]hca.PKey, 0, len(want))
	for _, k := range have {
		i := slices.IndexFunc(want, func(w hca.PKey) bool { return same(w, k) })
		if i < 0 {
			out = append(out, 0) // a hole, to be trimmed if trailing
			continue
		}
		out = append(out, want[i])
	}
	for len(out) > 0 && out[len(out)-1] == 0 {
		out = out[:len(out)-1]
	}
	if slices.Contains(out, 0) {
		return nil, false
	}
	for _, w := range want {
		if !slices.ContainsFunc(out, func(k hca.PKey) bool { return same(k, w) }) {
			out = append(out, w)
		}
	}
	return out, true
}

func pkeyList(t []hca.PKey) string {
	var s []string
	for _, k := range t {
		s = append(s, control.PKeyString(uint16(k)))
	}
	return strings.Join(s, ",")
}

// sameChild reports whether a running child is the one the file asks
// for: same name, partition, membership and addresses.
func sameChild(a, b config.Child) bool {
	return a.Name == b.Name && a.PKey == b.PKey && slices.Equal(a.Addrs, b.Addrs)
}

// notLive names the keys whose change a reload cannot apply.
func notLive(cur, next UpOptions) []string {
	var out []string
	for _, k := range []struct {
		key     string
		changed bool
	}{
		{"dev", cur.Dev != next.Dev}, {"addr", cur.Addr != next.Addr}, {"hca", cur.HCA != next.HCA},
		{"bind", cur.Bind.Addr() != next.Bind.Addr()}, {"port", cur.Bind.Port() != next.Bind.Port()},
		{"multicast", cur.Multicast != next.Multicast}, {"mode", cur.Mode != next.Mode},
		{"mtu", cur.MTU != next.MTU}, {"ib-mtu", cur.IBMTU != next.IBMTU}, {"pkey", cur.PKey != next.PKey},
		{"max-rx-conns", cur.MaxRXConns != next.MaxRXConns}, {"max-rx-conns-per-peer", cur.MaxRXConnsPerPeer != next.MaxRXConnsPerPeer},
		{"max-half-open", cur.MaxHalfOpen != next.MaxHalfOpen},
		{"recv-queue-size", cur.RecvQueueSize != next.RecvQueueSize}, {"recv-queue-max", cur.RecvQueueMax != next.RecvQueueMax},
		{"loss", cur.Loss != next.Loss}, {"dup", cur.Dup != next.Dup}, {"reorder", cur.Reorder != next.Reorder},
		{"delay", cur.Delay != next.Delay}, {"delay-time", cur.DelayTime != next.DelayTime}, {"seed", cur.Seed != next.Seed},
		{"rc-retry", cur.RCRetry != next.RCRetry}, {"ack-timeout", cur.AckTimeout != next.AckTimeout},
		{"udp-offload", cur.UDPOffload != next.UDPOffload}, {"offloads", cur.Offloads != next.Offloads},
		{"host", cur.Host != next.Host}, {"control-dir", cur.ControlDir != next.ControlDir},
	} {
		if k.changed {
			out = append(out, k.key)
		}
	}
	return out
}
