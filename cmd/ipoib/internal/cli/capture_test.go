package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/capture"
	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// softPair is what 'ipoib fabric' builds for two hosts, with gVisor hosts
// in place of the TAPs so it runs without root.
type softPair struct {
	hosts [2]*netstack.Host
	soft  [2]*softHost
	addrs [2]netip.Addr
}

func newSoftPair(t *testing.T) *softPair {
	t.Helper()
	mux := &capture.Mux{}
	fab := soft.NewFabric(soft.Config{Seed: 1, Tap: mux})
	t.Cleanup(func() { fab.Close() })
	p := &softPair{}
	for i := range 2 {
		name := fmt.Sprintf("ipoib-h%d", i+1)
		p.addrs[i] = netip.AddrFrom4([4]byte{10, 77, 8, byte(i + 1)})
		h, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(p.addrs[i], 24)}, MTU: 65520})
		if err != nil {
			t.Fatal(err)
		}
		p.hosts[i] = h
		dev, err := fab.NewDevice(name)
		if err != nil {
			t.Fatal(err)
		}
		ifc, err := ipoibcm.New(ipoibcm.Config{Device: dev, Host: h, Name: "ib0", Mode: ipoibcm.ModeConnected, Events: mux.Observer(name)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ifc.Start(); err != nil {
			t.Fatal(err)
		}
		p.soft[i] = &softHost{host: name, ifc: ifc, dev: dev, mux: mux, addrs: []netip.Prefix{netip.PrefixFrom(p.addrs[i], 24)}}
		t.Cleanup(func() { p.soft[i].Close() })
	}
	return p
}

// captureWhile runs 'ipoib capture args...' against the control socket
// in dir, calling traffic until the capture ends, and returns the file.
func captureWhile(t *testing.T, dir string, traffic func(ctx context.Context), args ...string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "capture.pcapng")
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- Main(context.Background(), append([]string{"capture", "-w", file}, args...),
			Env{ControlDir: dir, Stdout: &bytes.Buffer{}, Stderr: &stderr})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("capture %v: exit %d: %s", args, code, stderr.String())
			}
			if !strings.Contains(stderr.String(), "bytes of pcapng") {
				t.Errorf("summary line %q", stderr.String())
			}
			return file
		case <-ctx.Done():
			t.Fatalf("capture %v did not end within 30 s of traffic", args)
		default:
		}
		traffic(ctx)
	}
}

// checkCapture reads file back: pcapng, every ICRC valid (the check
// icrccheck makes), and, where tshark exists, ICMP echo requests decoded
// inside the RoCEv2 frames and no CM MAD when only data was asked for.
func checkCapture(t *testing.T, file string, dataOnly bool, port uint16) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != 0x0A0D0D0A {
		t.Fatalf("not pcapng: % x", b[:min(len(b), 8)])
	}
	rep, err := wire.CheckPcapICRC(bytes.NewReader(b), port)
	if err != nil || !rep.OK() {
		t.Fatalf("ICRC: %v %v", rep, err)
	}
	t.Logf("ICRC: %v", rep)
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed: pcapng and ICRCs checked, decode not")
	}
	roce := fmt.Sprintf("infiniband.rroce.port:%d", port)
	out, err := exec.Command(tshark, "-o", roce, "-r", file, "-Y", "frame.interface_id == 0 && icmp", "-T", "fields", "-e", "infiniband.bth.opcode", "-e", "icmp.type").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	if !strings.Contains(string(out), "\t8") {
		t.Fatalf("no ICMP echo request decoded inside the IB frames:\n%s", out)
	}
	if out, err := exec.Command(tshark, "-o", roce, "-r", file, "-Y", "_ws.malformed", "-T", "fields", "-e", "frame.number").Output(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("malformed frames: %q %v", out, err)
	}
	if dataOnly {
		if out, err := exec.Command(tshark, "-o", roce, "-r", file, "-Y", "infiniband.mad", "-T", "fields", "-e", "frame.number").Output(); err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Fatalf("--kind data recorded CM MADs: %q %v", out, err)
		}
	}
}

// TestCaptureCommand runs 'ipoib capture' against a soft fabric served on
// a control socket while the hosts ping.
func TestCaptureCommand(t *testing.T) {
	p := newSoftPair(t)
	dir := t.TempDir()
	srv, err := control.Listen(dir, []control.Endpoint{p.soft[0], p.soft[1]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	file := captureWhile(t, dir, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		p.hosts[0].Ping(pctx, p.addrs[1], 1000)
	}, "--host", "ipoib-h1", "--kind", "data", "--count", "20")
	checkCapture(t, file, true, wire.RoCEv2Port)
}

// TestCaptureUpRoCEv2: on 'ipoib up' the capture is of what the RoCEv2
// device sends and accepts.
func TestCaptureUpRoCEv2(t *testing.T) {
	p := newUpPair(t, rocev2.Faults{})
	dir := t.TempDir()
	srv, err := control.Listen(dir, []control.Endpoint{p.ups[0]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	file := captureWhile(t, dir, func(context.Context) { p.ping(t, 0, 3000) }, "--count", "30")
	// The pair runs on a borrowed port, not 4791: tshark is told.
	checkCapture(t, file, false, p.devs[0].LocalAddr().Port())
}
