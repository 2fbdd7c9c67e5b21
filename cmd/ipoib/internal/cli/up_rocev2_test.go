package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/capture"
	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// upPair is what 'ipoib up' builds on two hosts, with gVisor hosts in
// place of the TAPs and loopback addresses in place of the veth, so it
// runs without root.
type upPair struct {
	hosts [2]*netstack.Host
	devs  [2]*rocev2.Device
	ups   [2]*upHost
	addrs [2]netip.Addr
	// transfers counts transfer calls: each listens on its own port, as
	// the last one's may still be in TIME_WAIT.
	transfers uint16
}

func borrowPort(t *testing.T, a netip.Addr) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
}

func newUpPair(t *testing.T, faults rocev2.Faults) *upPair {
	t.Helper()
	return newUpPairMTU(t, faults, [2]hca.MTU{})
}

// newUpPairMTU is newUpPair with each device's IB MTU (0: the default).
func newUpPairMTU(t *testing.T, faults rocev2.Faults, ibMTU [2]hca.MTU) *upPair {
	t.Helper()
	return newUpPairLog(t, faults, ibMTU, slog.New(slog.DiscardHandler))
}

// newUpPairLog is newUpPairMTU logging to log.
func newUpPairLog(t *testing.T, faults rocev2.Faults, ibMTU [2]hca.MTU, log *slog.Logger) *upPair {
	t.Helper()
	p := &upPair{}
	binds := [2]netip.Addr{netip.MustParseAddr("127.77.0.1"), netip.MustParseAddr("127.77.0.2")}
	port := borrowPort(t, binds[0])
	for i := range 2 {
		p.addrs[i] = netip.AddrFrom4([4]byte{10, 77, 9, byte(i + 1)})
		h, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(p.addrs[i], 24)}, MTU: 65520})
		if err != nil {
			t.Fatal(err)
		}
		p.hosts[i] = h
		f := faults
		f.Seed += uint64(i)
		mux := &capture.Mux{}
		dev, err := rocev2.New(rocev2.Config{Tap: mux, Bind: netip.AddrPortFrom(binds[i], port), Peers: []netip.Addr{binds[1-i]}, MTU: ibMTU[i],
			Faults: f, MinAckTimeout: 20 * time.Millisecond, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		p.devs[i] = dev
		ifc, err := ipoibcm.New(ipoibcm.Config{Device: dev, Host: h, Name: "ib0", Mode: ipoibcm.ModeConnected, RCRetry: 6, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		if err := ifc.Start(); err != nil {
			t.Fatal(err)
		}
		p.ups[i] = &upHost{name: fmt.Sprintf("ib0@%v", binds[i]), ifc: ifc, dev: dev, mux: mux, addrs: []netip.Prefix{netip.PrefixFrom(p.addrs[i], 24)}}
	}
	t.Cleanup(func() {
		for i := range 2 {
			if err := errors.Join(p.ups[i].ifc.Close(), p.devs[i].Close()); err != nil {
				t.Errorf("close host %d: %v", i, err)
			}
		}
	})
	return p
}

func (p *upPair) ping(t *testing.T, from int, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.hosts[from].Ping(ctx, p.addrs[1-from], size); err != nil {
		t.Fatalf("ping %v -> %v (%d bytes): %v", p.addrs[from], p.addrs[1-from], size, err)
	}
}

// transfer sends n random bytes over TCP from host 0 to host 1 and checks
// them by SHA-256.
func (p *upPair) transfer(t *testing.T, n int) {
	t.Helper()
	port := 5001 + p.transfers
	p.transfers++
	l, err := p.hosts[1].ListenTCP(port)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan [32]byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- [32]byte{}
			return
		}
		defer c.Close()
		h := sha256.New()
		_, _ = io.Copy(h, c)
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := p.hosts[0].DialTCP(ctx, netip.AddrPortFrom(p.addrs[1], port))
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case sum := <-got:
		if sum != sha256.Sum256(data) {
			t.Fatalf("%d bytes arrived corrupted or short", n)
		}
	case <-ctx.Done():
		t.Fatalf("transfer of %d bytes timed out", n)
	}
}

// showJSON is what 'ipoib show --json' carries for an up host.
func showJSON(t *testing.T, h *upHost) map[string]any {
	t.Helper()
	b, err := json.Marshal(h.Stats())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func rocev2Counter(t *testing.T, h *upHost, path ...string) float64 {
	t.Helper()
	return testutil.JSONNumber(t, showJSON(t, h)["rocev2"], path...)
}

// TestUpOverRoCEv2 runs what 'ipoib up' runs on two hosts, 1% of the
// datagrams dropped: ping, a checked TCP transfer in both modes, garbage
// at the UDP port counted per reason and shown by 'ipoib show' while the
// link keeps working.
func TestUpOverRoCEv2(t *testing.T) {
	p := newUpPair(t, rocev2.Faults{Seed: 11, Drop: 0.01})
	p.ping(t, 0, 56)
	p.ping(t, 1, 60000)
	p.transfer(t, 8<<20)
	if n := rocev2Counter(t, p.ups[0], "fault_dropped"); n == 0 {
		t.Fatal("no datagram dropped by the 1% fault")
	}

	// Garbage from a stranger on the fabric's port.
	from := netip.AddrPortFrom(netip.MustParseAddr("127.77.0.3"), p.devs[1].LocalAddr().Port())
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(from))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := rocev2Counter(t, p.ups[1], "rx_drops", "garbage")
	badICRC := wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCSendOnly, PKey: 0xFFFF, DestQP: 0x42}})
	for _, b := range [][]byte{[]byte("junk") /* shorter than BTH + ICRC */, badICRC} {
		if _, err := c.WriteToUDPAddrPort(b, p.devs[1].LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	// The garbage went out before this ping; the device reads its socket
	// in order, so once the ping is answered the drops are counted.
	p.ping(t, 0, 56)
	if g, icrc := rocev2Counter(t, p.ups[1], "rx_drops", "garbage"), rocev2Counter(t, p.ups[1], "rx_drops", "bad_icrc"); g != before+1 || icrc != 1 {
		t.Fatalf("garbage %v (was %v), bad_icrc %v", g, before, icrc)
	}
	var out bytes.Buffer
	raw, _ := json.Marshal(p.ups[1].Stats())
	if err := control.Format(&out, control.InterfaceStats{Interface: p.ups[1].Info(), Stats: raw}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rocev2.rx_drops.garbage: 1", "rocev2.rx_drops.bad_icrc: 1", "mode connected mtu 65520"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("ipoib show lacks %q:\n%s", want, out.String())
		}
	}

	for _, h := range p.ups {
		if err := h.SetMode("datagram"); err != nil {
			t.Fatal(err)
		}
	}
	if info := p.ups[0].Info(); info.Mode != "datagram" || info.MTU != 4092 {
		t.Fatalf("after mode switch: %+v", info)
	}
	if err := p.hosts[0].SetMTU(4092); err != nil {
		t.Fatal(err)
	}
	if err := p.hosts[1].SetMTU(4092); err != nil {
		t.Fatal(err)
	}
	p.transfer(t, 2<<20)
	if err := p.ups[0].SetMode("warp"); err == nil {
		t.Fatal("bad mode accepted")
	}
}

func runUpCLI(t *testing.T, env Env, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	env.ControlDir = t.TempDir()
	code := Main(context.Background(), args, env)
	return code, errb.String()
}

// TestUpSetupErrorsExitTwo: an address in use, an address not on this
// host and no root each give one line and status 2, before any TAP.
func TestUpSetupErrorsExitTwo(t *testing.T) {
	taken, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := fmt.Sprint(taken.LocalAddr().(*net.UDPAddr).Port)
	root := Env{Euid: func() int { return 0 }}
	for _, tc := range []struct {
		env  Env
		args []string
		want string
	}{
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--port", port}, "address already in use"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "192.0.2.77"}, "cannot assign requested address"},
		{Env{Euid: func() int { return 1000 }}, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1"}, "needs root"},
		{root, []string{"up", "--addr", "10.77.0.1", "--bind", "127.0.0.1"}, "--addr"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--loss", "2"}, "--loss"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--ib-mtu", "1500"}, "--ib-mtu"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--peers", "::1"}, "--peers"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--hca", "soft"}, "--hca"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--rc-retry", "8"}, "--rc-retry"},
		{root, []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--offloads", "yes"}, "--offloads"},
	} {
		code, stderr := runUpCLI(t, tc.env, tc.args...)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code != ExitUsage || len(lines) != 1 || !strings.Contains(stderr, tc.want) || !strings.HasPrefix(stderr, "ipoib up") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestE2EScript runs .ci/e2e-rocev2.sh: two 'ipoib up' processes in two
// namespaces over a veth pair, iperf3 with loss in both modes, tshark's
// decode of the capture and the ICRC check.
func TestE2EScript(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end script takes about a minute; not in -short")
	}
	// CI runs the script directly after the unit tests (.ci/run); running
	// it here as well would double its minute and race the other packages'
	// tests for the machine, so from go test it is opt-in.
	if os.Getenv("IPOIB_E2E") != "1" {
		t.Skip("set IPOIB_E2E=1 to run .ci/e2e-rocev2.sh from go test (CI runs the script itself)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (uid 0) for network namespaces, veth and TAP devices")
	}
	for _, tool := range []string{"ip", "iperf3", "tshark", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not in PATH: apt-get install %s", tool, map[string]string{"ip": "iproute2"}[tool]+map[bool]string{true: tool}[tool != "ip"])
		}
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
	script := filepath.Join(root, ".ci", "e2e-rocev2.sh")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("e2e-rocev2: ALL PASS")) {
		t.Fatalf("script failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestUpDifferentIBMTUs: one end at --ib-mtu 4096, the other at 1024. The
// REQ from the 4096 end is refused with REJ INVALID_MTU and resent lower
// until it fits, so a TCP transfer of full-size segments gets through in
// both directions; before, every packet larger than 1024 bytes vanished.
func TestUpDifferentIBMTUs(t *testing.T) {
	p := newUpPairMTU(t, rocev2.Faults{}, [2]hca.MTU{hca.MTU4096, hca.MTU1024})
	p.transfer(t, 4<<20)
	p.ping(t, 0, 8000)
	p.ping(t, 1, 8000)
	small, big := p.ups[1].ifc.Stats().Reaper, p.ups[0].ifc.Stats().Reaper
	if small.RXRejectedMTU != 2 || big.TXMTUDowngrades != 2 {
		t.Fatalf("1024 end rejected %d REQs, 4096 end lowered %d times; want 2 and 2 (4096 -> 2048 -> 1024)",
			small.RXRejectedMTU, big.TXMTUDowngrades)
	}
	if d := p.devs[1].Stats().Dropped(wire.DropTruncated); d != 0 {
		t.Fatalf("the 1024 end dropped %d datagrams too large for it", d)
	}
}
