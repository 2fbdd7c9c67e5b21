package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/tap"
)

// Scenarios of the RoCEv2 iperf3 suite, all across one veth pair.
const (
	// ScenarioUDPPipe: two TAPs joined by one UDP datagram per frame.
	ScenarioUDPPipe = "udp-pipe"
	// ScenarioUDPPipeOffload: two vnet-header TAPs joined by UDP GSO/GRO
	// sockets, frames crossing with their offload metadata as they are
	// (UDPMetaPort): the best a userspace UDP encapsulation does here.
	ScenarioUDPPipeOffload = "udp-pipe-offload"
	// ScenarioWireGuardGo: wireguard-go (golang.zx2c4.com/wireguard) in
	// each namespace, a TUN with its offloads and UDP GSO/GRO sockets, at
	// the veth's MTU less WireGuardOverhead in every mode.
	ScenarioWireGuardGo = "wireguard-go"
	// ScenarioIBRoCEv2: ib0 in each namespace, one 'ipoib up' process
	// each, RoCEv2 over the veth.
	ScenarioIBRoCEv2 = "ib0-rocev2"
)

// RoCEv2SuiteConfig configures RunRoCEv2IperfSuite.
type RoCEv2SuiteConfig struct {
	// Exe is the ipoib binary whose 'up' command runs ib0.
	Exe      string
	Modes    []string
	MTU      map[string]int
	Duration time.Duration
	Streams  int
	// IBMTU is the IB path MTU of the RoCEv2 devices; default 4096.
	IBMTU int
	// VethMTU is the underlay's MTU; default 9000 so 4096-byte IB
	// packets (4156-byte IP datagrams) fit.
	VethMTU int
	// UnderlayA/B address the veth ends; defaults 10.79.0.1/24, .2.
	UnderlayA, UnderlayB netip.Prefix
	Owner                *tap.Owner
	Progress             io.Writer
	// ReadyTimeout bounds the wait for an 'ipoib up' process; default 15s.
	ReadyTimeout time.Duration
	// UpArgs are passed to every 'ipoib up' after the suite's own.
	UpArgs []string
	// IBOffloads says UpArgs give ib0's TAPs offloads (a virtio header);
	// the ib0 rows' offloads column shows it. The udp-pipe has none.
	IBOffloads bool
	// UpCPUProfile, when set, makes each 'ipoib up' write a CPU profile
	// of its run to UpCPUProfile.MODE.a and .b (a and b the namespaces'
	// sides): the engine and the HCA live in those processes, not in the
	// one running the suite.
	UpCPUProfile string
}

// upProfilePath is where the 'ipoib up' of side ("a" or "b") in mode
// writes its CPU profile; "" when none is asked for.
func (c *RoCEv2SuiteConfig) upProfilePath(mode, side string) string {
	if c.UpCPUProfile == "" {
		return ""
	}
	return c.UpCPUProfile + "." + mode + "." + side
}

func (c *RoCEv2SuiteConfig) defaults() {
	if c.IBMTU == 0 {
		c.IBMTU = 4096
	}
	if c.VethMTU == 0 {
		c.VethMTU = 9000
	}
	if !c.UnderlayA.IsValid() {
		c.UnderlayA = netip.MustParsePrefix("10.79.0.1/24")
	}
	if !c.UnderlayB.IsValid() {
		c.UnderlayB = netip.MustParsePrefix("10.79.0.2/24")
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 15 * time.Second
	}
}

// RoCEv2Comparison sets ib0 over RoCEv2 against the udp-pipe and
// wireguard-go baselines of the same run; a ratio whose runs failed is 0.
type RoCEv2Comparison struct {
	Mode               string  `json:"mode"`
	IBGbps             float64 `json:"ib0_gbps"`
	UDPPipeGbps        float64 `json:"udp_pipe_gbps"`
	Ratio              float64 `json:"ratio_to_udp_pipe"`
	UDPPipeOffloadGbps float64 `json:"udp_pipe_offload_gbps"`
	RatioOffload       float64 `json:"ratio_to_udp_pipe_offload"`
	WireGuardGoGbps    float64 `json:"wireguard_go_gbps"`
	RatioWireGuardGo   float64 `json:"ratio_to_wireguard_go"`
}

// RoCEv2Report is the outcome of RunRoCEv2IperfSuite.
type RoCEv2Report struct {
	IperfReport
	VsUDPPipe []RoCEv2Comparison `json:"vs_udp_pipe"`
}

// compare fills VsUDPPipe, one entry per mode with an ib0 run.
func (r *RoCEv2Report) compare() {
	r.VsUDPPipe = r.VsUDPPipe[:0]
	find := func(scenario, mode string) float64 {
		for _, run := range r.Runs {
			if run.Scenario == scenario && run.Mode == mode && run.Result != nil {
				return run.Result.Gbps
			}
		}
		return 0
	}
	for _, run := range r.Runs {
		if run.Scenario != ScenarioIBRoCEv2 {
			continue
		}
		c := RoCEv2Comparison{Mode: run.Mode, IBGbps: find(ScenarioIBRoCEv2, run.Mode), UDPPipeGbps: find(ScenarioUDPPipe, run.Mode),
			UDPPipeOffloadGbps: find(ScenarioUDPPipeOffload, run.Mode), WireGuardGoGbps: find(ScenarioWireGuardGo, run.Mode)}
		if c.IBGbps > 0 && c.UDPPipeGbps > 0 {
			c.Ratio = c.IBGbps / c.UDPPipeGbps
		}
		if c.IBGbps > 0 && c.UDPPipeOffloadGbps > 0 {
			c.RatioOffload = c.IBGbps / c.UDPPipeOffloadGbps
		}
		if c.IBGbps > 0 && c.WireGuardGoGbps > 0 {
			c.RatioWireGuardGo = c.IBGbps / c.WireGuardGoGbps
		}
		r.VsUDPPipe = append(r.VsUDPPipe, c)
	}
}

// WriteTable prints the runs and ib0's ratios to both udp-pipes and to
// wireguard-go.
func (r *RoCEv2Report) WriteTable(w io.Writer) error {
	if err := r.IperfReport.WriteTable(w); err != nil {
		return err
	}
	for _, c := range r.VsUDPPipe {
		if _, err := fmt.Fprintf(w, "%s mode: ib0-rocev2 %.2f Gbit/s vs udp-pipe %.2f Gbit/s: %s, vs udp-pipe-offload %.2f Gbit/s: %s, vs wireguard-go %.2f Gbit/s: %s\n",
			c.Mode, c.IBGbps, c.UDPPipeGbps, fmtRatio(c.Ratio), c.UDPPipeOffloadGbps, fmtRatio(c.RatioOffload), c.WireGuardGoGbps, fmtRatio(c.RatioWireGuardGo)); err != nil {
			return err
		}
	}
	return nil
}

// RunRoCEv2IperfSuite measures, for every mode, iperf3 single-stream TCP
// between two namespaces joined by a veth pair over: the udp-pipe,
// udp-pipe-offload and wireguard-go baselines and ib0 run by two 'ipoib
// up' processes (RoCEv2 over the veth), at the mode's MTU (the naive
// udp-pipe capped at what one UDP datagram carries, wireguard-go at what
// one of its datagrams on the veth carries: runMTU).
func RunRoCEv2IperfSuite(ctx context.Context, cfg RoCEv2SuiteConfig) (*RoCEv2Report, error) {
	cfg.defaults()
	// Namespaces of their own, so this suite and the soft-fabric one never
	// collide.
	base := IperfSuiteConfig{Modes: cfg.Modes, MTU: cfg.MTU, Duration: cfg.Duration, Streams: cfg.Streams, Owner: cfg.Owner, Progress: cfg.Progress,
		NetnsA: "ipoib-rbench-a", NetnsB: "ipoib-rbench-b"}
	base.defaults()
	if err := CheckIperfTools(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.Exe); err != nil {
		return nil, fmt.Errorf("rocev2 suite: ipoib binary: %w", err)
	}
	if removed, err := base.Owner.CleanupStale(); err != nil {
		return nil, fmt.Errorf("rocev2 suite: %w", err)
	} else if len(removed) > 0 {
		fmt.Fprintf(base.Progress, "removed stale namespaces of a crashed run: %v\n", removed)
	}
	rep := &RoCEv2Report{IperfReport: IperfReport{Started: time.Now(), Duration: base.Duration, Streams: base.Streams}}
	steps := cfg.steps()
	total, n := len(steps)*len(cfg.Modes), 0
	for _, mode := range cfg.Modes {
		mtu := cfg.MTU[mode]
		if mtu <= 0 {
			return nil, fmt.Errorf("rocev2 suite: no MTU for mode %q", mode)
		}
		for _, s := range steps {
			n++
			if err := ctx.Err(); err != nil {
				return rep, fmt.Errorf("rocev2 suite: %w", err)
			}
			runMTU := cfg.runMTU(s.scenario, mtu)
			fmt.Fprintf(base.Progress, "[%d/%d] %-10s mode %-9s mtu %5d: running %v ...\n", n, total, s.scenario, mode, runMTU, base.Duration)
			run := IperfRun{Scenario: s.scenario, Mode: mode, MTU: runMTU,
				Offloads: s.scenario == ScenarioUDPPipeOffload || s.scenario == ScenarioWireGuardGo || s.scenario == ScenarioIBRoCEv2 && cfg.IBOffloads}
			if res, err := runScenario(ctx, base, s.build, mode, runMTU); err != nil {
				run.Err = err.Error()
				fmt.Fprintf(base.Progress, "[%d/%d] %-10s FAILED: %s\n", n, total, s.scenario, run.Err)
			} else {
				run.Result = &res
				fmt.Fprintf(base.Progress, "[%d/%d] %-10s %.2f Gbit/s, %d retransmits\n", n, total, s.scenario, res.Gbps, res.Retransmits)
			}
			rep.Runs = append(rep.Runs, run)
		}
	}
	rep.compare()
	return rep, nil
}

// rocev2Step is one scenario of the suite, run once per mode.
type rocev2Step struct {
	scenario string
	build    linkBuilder
}

// steps are the suite's scenarios in the order each mode runs them.
func (c *RoCEv2SuiteConfig) steps() []rocev2Step {
	return []rocev2Step{{ScenarioUDPPipe, c.buildUDPPipe}, {ScenarioUDPPipeOffload, c.buildUDPPipeOffload},
		{ScenarioWireGuardGo, c.buildWireGuard}, {ScenarioIBRoCEv2, c.buildIB}}
}

// runMTU is the IP MTU scenario runs at in a mode of MTU mtu: the naive
// udp-pipe is capped at what one UDP datagram carries, wireguard-go runs
// at the most its datagrams on the veth carry whatever the mode's MTU.
func (c *RoCEv2SuiteConfig) runMTU(scenario string, mtu int) int {
	switch scenario {
	case ScenarioUDPPipe:
		return min(mtu, MaxUDPPipeFrame-14)
	case ScenarioWireGuardGo:
		return c.wireGuardMTU()
	}
	return mtu
}

// underlay joins a and b with a veth pair carrying the UDP traffic.
func (c *RoCEv2SuiteConfig) underlay(a, b *tap.Netns) error {
	return tap.CreateVethPair(a, "vu0", tap.LinkConfig{MTU: c.VethMTU, Addrs: []netip.Prefix{c.UnderlayA}, Up: true},
		b, "vu1", tap.LinkConfig{MTU: c.VethMTU, Addrs: []netip.Prefix{c.UnderlayB}, Up: true})
}

// udpPipePort is the UDP port of the udp-pipe baseline.
const udpPipePort = 4792

func (c *RoCEv2SuiteConfig) buildUDPPipe(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	return c.buildUDPTunnel(a, b, addrA, addrB, func(ns *tap.Netns, addr netip.Prefix, conn *net.UDPConn, far netip.AddrPort) (io.Closer, error) {
		dev, err := tap.Open(tap.Config{Name: "tp0", Netns: ns, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addr}, Up: true}})
		if err != nil {
			return nil, err
		}
		p, err := NewUDPPipe(dev, conn, far, mtu+14)
		if err != nil {
			return nil, errors.Join(err, dev.Close())
		}
		return p, nil
	})
}

// buildUDPPipeOffload is the udp-pipe with vnet-header TAPs and UDP
// GSO/GRO sockets: each side an OffloadTapPipe between its TAP and a
// UDPMetaPort, in segments as large as the underlay carries.
func (c *RoCEv2SuiteConfig) buildUDPPipeOffload(_ context.Context, _ string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	seg := c.VethMTU - 20 - 8
	return c.buildUDPTunnel(a, b, addrA, addrB, func(ns *tap.Netns, addr netip.Prefix, conn *net.UDPConn, far netip.AddrPort) (io.Closer, error) {
		dev, err := tap.Open(tap.Config{Name: "tp0", Netns: ns, VnetHdr: true, Link: tap.LinkConfig{MTU: mtu, Addrs: []netip.Prefix{addr}, Up: true}})
		if err != nil {
			return nil, err
		}
		port, err := NewUDPMetaPort(conn, far, seg, dev.HostOffloads())
		if err != nil {
			return nil, errors.Join(err, dev.Close())
		}
		p, err := NewOffloadTapPipe(dev, port)
		if err != nil {
			return nil, errors.Join(err, dev.Close())
		}
		if err := checkTapOffloads("udp-pipe-offload", dev); err != nil {
			return nil, errors.Join(err, p.Close())
		}
		return p, nil
	})
}

// udpTunnelSide joins one namespace's TAP (opened with addr) to conn,
// whose datagrams go to far; on an error it has closed what it opened,
// and the caller closes conn.
type udpTunnelSide func(ns *tap.Netns, addr netip.Prefix, conn *net.UDPConn, far netip.AddrPort) (io.Closer, error)

// buildUDPTunnel lays the underlay and, in each namespace, a UDP socket
// on the pipe port joined to a TAP by side.
func (c *RoCEv2SuiteConfig) buildUDPTunnel(a, b *tap.Netns, addrA, addrB netip.Prefix, side udpTunnelSide) (func() error, error) {
	if err := c.underlay(a, b); err != nil {
		return nil, err
	}
	var pipes []io.Closer
	stop := func() error {
		var errs []error
		for _, p := range pipes {
			errs = append(errs, p.Close())
		}
		return errors.Join(errs...)
	}
	for _, s := range []struct {
		ns         *tap.Netns
		addr       netip.Prefix
		local, far netip.Addr
	}{{a, addrA, c.UnderlayA.Addr(), c.UnderlayB.Addr()}, {b, addrB, c.UnderlayB.Addr(), c.UnderlayA.Addr()}} {
		conn, err := listenUDPIn(s.ns, netip.AddrPortFrom(s.local, udpPipePort))
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		p, err := side(s.ns, s.addr, conn, netip.AddrPortFrom(s.far, udpPipePort))
		if err != nil {
			conn.Close()
			return nil, errors.Join(err, stop())
		}
		pipes = append(pipes, p)
	}
	return stop, nil
}

// listenUDPIn opens a UDP socket inside ns that lets the kernel fragment
// datagrams above the path MTU (the udp-pipe carries whole frames).
func listenUDPIn(ns *tap.Netns, at netip.AddrPort) (*net.UDPConn, error) {
	var conn *net.UDPConn
	err := ns.Do(func() error {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(at))
		if err != nil {
			return err
		}
		raw, err := c.SyscallConn()
		if err != nil {
			c.Close()
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
			for _, o := range []int{unix.SO_RCVBUFFORCE, unix.SO_SNDBUFFORCE} {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o, 8<<20)
			}
		}); err != nil || serr != nil {
			c.Close()
			return errors.Join(err, serr)
		}
		conn = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("udp-pipe socket %v in %s: %w", at, ns.Name(), err)
	}
	return conn, nil
}

// buildIB starts one 'ipoib up' per namespace over the veth underlay.
func (c *RoCEv2SuiteConfig) buildIB(ctx context.Context, mode string, mtu int, a, b *tap.Netns, addrA, addrB netip.Prefix) (func() error, error) {
	if err := c.underlay(a, b); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ipoib-bench-ctl-")
	if err != nil {
		return nil, fmt.Errorf("control dir: %w", err)
	}
	var procs []*UpProcess
	stop := func() error {
		var errs []error
		for _, p := range procs {
			errs = append(errs, p.Stop(10*time.Second))
		}
		return errors.Join(append(errs, os.RemoveAll(dir))...)
	}
	for _, side := range []struct {
		name       string
		ns         *tap.Netns
		addr       netip.Prefix
		local, far netip.Addr
	}{{"a", a, addrA, c.UnderlayA.Addr(), c.UnderlayB.Addr()}, {"b", b, addrB, c.UnderlayB.Addr(), c.UnderlayA.Addr()}} {
		args := []string{"--dev", "ib0", "--addr", side.addr.String(), "--bind", side.local.String(), "--peers", side.far.String(),
			"--mode", mode, "--mtu", strconv.Itoa(mtu), "--ib-mtu", strconv.Itoa(c.IBMTU), "--control-dir", dir}
		if path := c.upProfilePath(mode, side.name); path != "" {
			args = append(args, "--cpuprofile", path)
		}
		p, err := StartUp(ctx, c.Exe, side.ns.Name(), c.ReadyTimeout, append(args, c.UpArgs...)...)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		procs = append(procs, p)
	}
	return stop, nil
}

// upReadyMessage is the log line 'ipoib up' prints once ib0 is up and
// the control socket serves.
const upReadyMessage = `msg="up; stop with Ctrl-C"`

// UpProcess is a running 'ipoib up' in a namespace.
type UpProcess struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited
	mu   sync.Mutex
	tail []string // last lines of its log, for error reports
	err  error    // Wait's result, valid after done
}

const upLogTail = 20

// StartUp runs exe up args... inside namespace ns (ip netns exec) and
// waits until it logs that it is up, it exits, or timeout passes.
func StartUp(ctx context.Context, exe, ns string, timeout time.Duration, args ...string) (*UpProcess, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, exe, "up"}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("ipoib up in %s: %w", ns, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("ipoib up in %s: %w", ns, err)
	}
	p := &UpProcess{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > upLogTail {
				p.tail = p.tail[1:]
			}
			p.mu.Unlock()
			if !signalled && strings.Contains(line, upReadyMessage) {
				signalled = true
				close(ready)
			}
		}
	}()
	go func() {
		<-scanned // Wait closes the pipe; read it all first
		p.err = cmd.Wait()
		close(p.done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("ipoib up in %s exited before it was up (%v): %s", ns, p.err, p.Tail())
	case <-t.C:
		return nil, errors.Join(fmt.Errorf("ipoib up in %s not up after %v: %s", ns, timeout, p.Tail()), p.Stop(5*time.Second))
	}
}

// Tail returns the last lines the process logged.
func (p *UpProcess) Tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, " | ")
}

// Stop sends SIGTERM and waits up to grace for a clean exit, then kills.
// A process that had to be killed, or exited non-zero, is an error.
func (p *UpProcess) Stop(grace time.Duration) error {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("ipoib up did not stop within %v after SIGTERM: %s", grace, p.Tail())
		}
	}
	if p.err != nil {
		return fmt.Errorf("ipoib up exited: %w: %s", p.err, p.Tail())
	}
	return nil
}

// WriteJSON writes the report, comparisons included, as indented JSON.
func (r *RoCEv2Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("rocev2 report: %w", err)
	}
	return nil
}
