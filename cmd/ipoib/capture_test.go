package main

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
	"github.com/ipoibcm/ipoib/cmd/ipoib/internal/cli"
	"github.com/ipoibcm/ipoib/control"
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

// TestCaptureCommand runs 'ipoib capture' against a soft fabric served on
// a control socket while the hosts ping: the file is pcapng with the
// requested number of messages, every ICRC valid, and (where tshark
// exists) it decodes as RoCEv2 carrying IPoIB ICMP.
func TestCaptureCommand(t *testing.T) {
	p := newSoftPair(t)
	dir := t.TempDir()
	srv, err := control.Listen(dir, []control.Endpoint{p.soft[0], p.soft[1]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	file := filepath.Join(dir, "h1.pcapng")
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- cli.Main(context.Background(), []string{"capture", "--host", "ipoib-h1", "-w", file, "--kind", "data", "--count", "20"},
			cli.Env{ControlDir: dir, Stdout: &bytes.Buffer{}, Stderr: &stderr})
	}()
	// Traffic until the capture has its 20 messages.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var code int
traffic:
	for {
		select {
		case code = <-done:
			break traffic
		case <-ctx.Done():
			t.Fatal("capture did not end within 30 s of pings")
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		p.hosts[0].Ping(pctx, p.addrs[1], 1000)
		pcancel()
	}
	if code != 0 {
		t.Fatalf("capture exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "ipoib-h1: ") {
		t.Errorf("summary line %q", stderr.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != 0x0A0D0D0A {
		t.Fatalf("not pcapng: % x", b[:min(len(b), 8)])
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed: pcapng written, decode not checked")
	}
	out, err := exec.Command(tshark, "-r", file, "-Y", "frame.interface_id == 0 && icmp", "-T", "fields", "-e", "infiniband.bth.opcode", "-e", "icmp.type").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	if !strings.Contains(string(out), "\t8") {
		t.Fatalf("no ICMP echo request decoded inside the IB frames:\n%s", out)
	}
	if out, err := exec.Command(tshark, "-r", file, "-Y", "infiniband.mad", "-T", "fields", "-e", "frame.number").Output(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("--kind data recorded CM MADs: %q %v", out, err)
	}
	pcap := filepath.Join(dir, "h1.pcap")
	if out, err := exec.Command(tshark, "-r", file, "-Y", "frame.interface_id == 0", "-F", "pcap", "-w", pcap).CombinedOutput(); err != nil {
		t.Fatalf("tshark -F pcap: %v: %s", err, out)
	}
	f, err := os.Open(pcap)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := wire.CheckPcapICRC(f, wire.RoCEv2Port)
	if err != nil || !rep.OK() {
		t.Fatalf("ICRC: %v %v", rep, err)
	}
	t.Logf("ICRC: %v", rep)
}
