package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// usageLine is the one line a bad command line of cmd gets.
func usageLine(cmd, msg string) string {
	return fmt.Sprintf("ipoib %s: %s (run 'ipoib %s -h')\n", cmd, msg, cmd)
}

// TestBinaryBadCommandLines: every bad flag or argument of every command
// gets exit status 2 and exactly one line on stderr, this line, before
// anything exists: no namespace (with its marker), no TAP, no control
// socket, no capture or profile file. As root the fabric and up cases
// would otherwise create them (they did: 'fabric --mtu 50' failed after
// the first namespace, 'bench --mtu 70000' after starting, '--metrics
// notanaddr' after the listen, 'soak --capture-packets 0' ran a soak).
func TestBinaryBadCommandLines(t *testing.T) {
	const nsPrefix, dev = "ipoib-t6u", "ipt6bad0"
	tmp := t.TempDir()
	ctl, markers := filepath.Join(tmp, "ctl"), filepath.Join(tmp, "markers")
	prof, pcap := filepath.Join(tmp, "cpu.prof"), filepath.Join(tmp, "c.pcapng")
	badConf := filepath.Join(tmp, "ib0.conf")
	if err := os.WriteFile(badConf, []byte("addr = \"10.77.0.1\"\nbind = \"127.0.0.1\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := "ib0-sixteen-char" // 16 bytes: the kernel keeps 15
	up := []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1"}
	upWith := func(args ...string) []string { return append(append([]string{}, up...), args...) }
	rocev2 := func(args ...string) []string { return append([]string{"soak", "--hca", "rocev2"}, args...) }
	const ifnameMsg = `want an interface name of 1..15 bytes without '/', ':' or spaces`
	const addrMsg = `want HOST:PORT, e.g. 127.0.0.1:9101`
	for _, tc := range []struct {
		args []string
		line string
	}{
		{[]string{"fabric", "--mtu", "70000"}, usageLine("fabric", "--mtu 70000: want 0 (the mode's default) or 576..65520 in connected mode")},
		{[]string{"fabric", "--mode", "datagram", "--mtu", "9000"}, usageLine("fabric", "--mtu 9000: want 0 (the mode's default) or 576..4092 in datagram mode")},
		{[]string{"fabric", "--mtu", "50"}, usageLine("fabric", "--mtu 50: want 0 (the mode's default) or 576..65520 in connected mode")},
		{[]string{"fabric", "--mode", "turbo"}, usageLine("fabric", `--mode "turbo": want connected or datagram`)},
		{[]string{"fabric", "--ifname", long}, usageLine("fabric", `--ifname "`+long+`": `+ifnameMsg)},
		{[]string{"fabric", "--hosts", "0"}, usageLine("fabric", "--hosts 0 out of range 2..254")},
		{[]string{"fabric", "--queues", "0"}, usageLine("fabric", "--queues 0 out of range 1..16")},
		{[]string{"fabric", "--queues", "17"}, usageLine("fabric", "--queues 17 out of range 1..16")},
		{[]string{"fabric", "--queues", "2", "--offloads", "off"}, usageLine("fabric", "--queues 2 needs --offloads on (a multi-queue TAP is opened with the virtio header)")},
		{upWith("--queues", "0"), usageLine("up", "--queues 0 out of range 1..16")},
		{upWith("--queues", "17"), usageLine("up", "--queues 17 out of range 1..16")},
		{[]string{"fabric", "--hosts", "1"}, usageLine("fabric", "--hosts 1: a fabric needs at least 2 hosts (one host's ib0 has no peer to carry a packet to)")},
		{[]string{"fabric", "--hosts", "255"}, usageLine("fabric", "--hosts 255 out of range 2..254")},
		{[]string{"fabric", "--hosts", "x"}, usageLine("fabric", `invalid value "x" for flag -hosts: parse error`)},
		{[]string{"fabric", "--metrics", "notanaddr"}, usageLine("fabric", `--metrics "notanaddr": `+addrMsg)},
		{[]string{"fabric", "--pprof", "6060"}, usageLine("fabric", `--pprof "6060": `+addrMsg)},
		{[]string{"fabric", "--log-level", "loud"}, usageLine("fabric", `invalid value "loud" for flag -log-level: want debug, info, warn or error`)},
		{[]string{"fabric", "--prefix", "fd00::/64"}, usageLine("fabric", `--prefix "fd00::/64": want an IPv4 prefix like 10.77.0.0/24`)},
		{[]string{"fabric", "--prefix", "10.0.0.0/30", "--hosts", "3"}, usageLine("fabric", "--prefix 10.0.0.0/30 has room for 2 hosts, not 3")},
		{[]string{"fabric", "--netns-prefix", "a/b"}, usageLine("fabric", `--netns-prefix "a/b": want 1..24 characters without '/' or spaces`)},
		{[]string{"fabric", "--offloads", "maybe"}, usageLine("fabric", `--offloads "maybe": want on or off`)},
		{[]string{"fabric", "--partition", "0x8001=1,3"}, usageLine("fabric", "--partition 0x8001: host 3, but --hosts is 2")},
		{[]string{"fabric", "extra"}, usageLine("fabric", `unexpected argument "extra"`)},
		{upWith("--mtu", "70000"), usageLine("up", "--mtu 70000: want 0 (the mode's default) or 576..65520 in connected mode")},
		{upWith("--mode", "datagram", "--mtu", "9000"), usageLine("up", "--mtu 9000: want 0 (the mode's default) or 576..4092 in datagram mode")},
		{upWith("--ib-mtu", "1024", "--mode", "datagram", "--mtu", "2000"), usageLine("up", "--mtu 2000: want 0 (the mode's default) or 576..1020 in datagram mode")},
		{upWith("--ib-mtu", "1500"), usageLine("up", "--ib-mtu 1500: want 1024, 2048 or 4096")},
		{upWith("--dev", long), usageLine("up", `--dev "`+long+`": `+ifnameMsg)},
		{upWith("--metrics", "notanaddr"), usageLine("up", `--metrics "notanaddr": `+addrMsg)},
		{upWith("--pprof", "localhost"), usageLine("up", `--pprof "localhost": `+addrMsg)},
		{upWith("--log-level", "loud"), usageLine("up", `invalid value "loud" for flag -log-level: want debug, info, warn or error`)},
		{upWith("--port", "0"), usageLine("up", "--port 0 out of range 1..65535")},
		{upWith("--rc-retry", "8"), usageLine("up", "--rc-retry 8 out of range 0..7")},
		{upWith("--max-rx-conns", "0"), usageLine("up", "--max-rx-conns 0: want at least 1")},
		{upWith("--recv-queue-size", "2"), usageLine("up", "--recv-queue-size 2 out of range 4..8192")},
		{upWith("--recv-queue-size", "512", "--recv-queue-max", "256"), usageLine("up", "--recv-queue-max 256 out of range 512..8192")},
		{upWith("--recv-queue-max", "100000"), usageLine("up", "--recv-queue-max 100000 out of range 256..8192")},
		{upWith("--loss", "1.5"), usageLine("up", "--loss 1.5: want a probability in [0, 1]")},
		{upWith("--pkey", "0x8000"), usageLine("up", "--pkey 0x8000: 0x0000 and 0x8000 are not partitions")},
		{upWith("--peers", "fe80::1"), usageLine("up", `--peers: "fe80::1" is not an IP address of --bind's family`)},
		{upWith("--multicast", "yes"), usageLine("up", `--multicast "yes": want on or off`)},
		{upWith("--addr", "10.77.0.1"), usageLine("up", `--addr "10.77.0.1": want an IP prefix like 10.77.0.1/24`)},
		{upWith("--bind", "224.0.0.1"), usageLine("up", `--bind "224.0.0.1": want this host's unicast IP address on the link to the peers`)},
		{[]string{"up", "--bind", "127.0.0.1"}, usageLine("up", "--addr is required: the device's IP prefix, e.g. 10.77.0.1/24")},
		{[]string{"up", "--addr", "10.77.0.1/24"}, usageLine("up", "--bind is required: this host's IP address on the link to the peers, e.g. 192.0.2.1")},
		{[]string{"up", "--config", badConf}, "ipoib up: " + badConf + `:1: addr: "10.77.0.1": want an IP prefix like 10.77.0.1/24` + "\n"},
		{[]string{"bench", "--mtu", "70000"}, usageLine("bench", "--mtu 70000 out of range 1280..65520")},
		{[]string{"bench", "--mtu-datagram", "5000"}, usageLine("bench", "--mtu-datagram 5000 out of range 1280..4092")},
		{[]string{"bench", "--runs", "0"}, usageLine("bench", "--runs 0 out of range 1..1000")},
		{[]string{"bench", "--bytes", "0"}, usageLine("bench", "--bytes 0: want at least 1")},
		{[]string{"bench", "--hca", "rocev2"}, usageLine("bench", "--hca applies to --iperf runs only")},
		{[]string{"bench", "--streams", "4"}, usageLine("bench", "--streams applies to --iperf runs only")},
		{[]string{"bench", "--queues", "2"}, usageLine("bench", "--queues applies to --iperf runs only")},
		{[]string{"bench", "--iperf", "--bytes", "1000"}, usageLine("bench", "--bytes applies to in-process runs only (without --iperf)")},
		{[]string{"bench", "--iperf", "--hca", "ib"}, usageLine("bench", `--hca "ib": want soft or rocev2`)},
		{[]string{"bench", "--iperf", "--streams", "0"}, usageLine("bench", "--streams 0 out of range 1..128")},
		{[]string{"bench", "--iperf", "--queues", "17"}, usageLine("bench", "--queues 17 out of range 1..16")},
		{[]string{"bench", "--iperf", "--queues", "2", "--offloads", "off"}, usageLine("bench", "--queues 2 needs --offloads on (a multi-queue TAP is opened with the virtio header)")},
		{[]string{"bench", "--iperf", "--duration", "10ms"}, usageLine("bench", "--duration 10ms: want at least 1s")},
		{[]string{"bench", "--iperf", "--modes", "connected,warp"}, usageLine("bench", `--modes: "warp" is not connected or datagram`)},
		{[]string{"bench", "--pprof", "notanaddr"}, usageLine("bench", `--pprof "notanaddr": `+addrMsg)},
		{[]string{"soak", "--capture-packets", "0"}, usageLine("soak", "--capture-packets applies to --capture only")},
		{[]string{"soak", "--capture", pcap, "--capture-packets", "0"}, usageLine("soak", "--capture-packets 0 out of range 16..16777216")},
		{[]string{"soak", "--metrics", "notanaddr"}, usageLine("soak", `--metrics "notanaddr": `+addrMsg)},
		{[]string{"soak", "--ud-loss", "2"}, usageLine("soak", "--ud-loss 2: want a probability in [0, 1]")},
		{[]string{"soak", "--hosts", "1"}, usageLine("soak", "--hosts 1 out of range 2..62500")},
		{[]string{"soak", "--duration", "-1s"}, usageLine("soak", "--duration -1s: want at least 1ms")},
		{[]string{"soak", "--sendq", "2"}, usageLine("soak", "--sendq 2 out of range 4..65536")},
		{[]string{"soak", "--heap-growth", "0.5"}, usageLine("soak", "--heap-growth 0.5: want at least 1")},
		{[]string{"soak", "--no-such-flag"}, usageLine("soak", "flag provided but not defined: -no-such-flag")},
		{[]string{"soak", "--hca", "ib"}, usageLine("soak", `--hca "ib": want soft or rocev2`)},
		{rocev2("--purge"), usageLine("soak", "--purge does not apply to --hca rocev2")},
		{[]string{"soak", "--udp-loss", "0.1"}, usageLine("soak", "--udp-loss does not apply to --hca soft")},
		{rocev2("--udp-dup", "2"), usageLine("soak", "--udp-dup 2: want a probability in [0, 1]")},
		{rocev2("--hosts", "5000"), usageLine("soak", "--hosts 5000 out of range 2..4096")},
		{[]string{"soak", "extra"}, usageLine("soak", `unexpected argument "extra"`)},
		{[]string{"show", "--watch", "--interval", "1ms"}, usageLine("show", "--interval 1ms is below 10ms")},
		{[]string{"show", "--count", "3"}, usageLine("show", "--count applies to --watch only")},
		{[]string{"show", "--watch", "--count", "-1"}, usageLine("show", "--count -1: want 0 (until interrupted) or more")},
		{[]string{"show", "--json", "--brief"}, usageLine("show", "pick one of peers, -S, --json, --brief, --watch")},
		{[]string{"show", "--dev", "a b"}, usageLine("show", `--dev "a b": `+ifnameMsg)},
		{[]string{"show", "extra"}, usageLine("show", `unexpected argument "extra" (only 'peers')`)},
		{[]string{"capture"}, usageLine("capture", "-w FILE is required")},
		{[]string{"capture", "-w", pcap, "--kind", "tcp"}, usageLine("capture", `--kind "tcp": want all, cm or data`)},
		{[]string{"capture", "-w", pcap, "--qpn", "0"}, usageLine("capture", `--qpn "0": want a QP number 1..0xffffff`)},
		{[]string{"capture", "-w", pcap, "--duration", "-1s"}, usageLine("capture", "--duration -1s: want at least 0s")},
		{[]string{"capture", "-w", pcap, "--count", "-1"}, usageLine("capture", `invalid value "-1" for flag -count: parse error`)},
		{[]string{"config", "check"}, usageLine("config", "want 'check FILE'")},
		{[]string{"config", "check", badConf}, "ipoib config check: " + badConf + `:1: addr: "10.77.0.1": want an IP prefix like 10.77.0.1/24` + "\n"},
		{[]string{"down", "--timeout", "0"}, usageLine("down", "--timeout 0s: want at least 100ms")},
		{[]string{"down", "--dev", long}, usageLine("down", `--dev "`+long+`": `+ifnameMsg)},
		{[]string{"down", "extra"}, usageLine("down", `unexpected argument "extra"`)},
		{[]string{"reload", "extra"}, usageLine("reload", `unexpected argument "extra"`)},
		{[]string{"reload", "--dev", ""}, usageLine("reload", `--dev "": `+ifnameMsg)},
		{[]string{"cleanup", "extra"}, usageLine("cleanup", `unexpected argument "extra"`)},
		{[]string{"mode", "fast"}, usageLine("mode", "want exactly one of: connected, datagram")},
		{[]string{"child", "add", "0x8000"}, usageLine("child", "P_Key 0x8000: 0x0000 and 0x8000 are not partitions")},
		{[]string{"version", "extra"}, usageLine("version", `unexpected argument "extra"`)},
		{[]string{"nosuch"}, "ipoib: unknown command \"nosuch\" (run 'ipoib help')\n"},
	} {
		args := tc.args
		switch args[0] {
		case "fabric":
			args = append([]string{"fabric", "--netns-prefix", nsPrefix, "--cpuprofile", prof}, args[1:]...)
		case "up":
			args = append([]string{"up", "--dev", dev, "--cpuprofile", prof}, args[1:]...)
		case "bench":
			args = append([]string{"bench", "--cpuprofile", prof}, args[1:]...)
		case "cleanup":
			args = append(args, "--marker-dir", markers)
		}
		switch args[0] {
		case "fabric", "up", "show", "capture", "down", "reload", "cleanup", "mode", "child":
			args = append(args, "--control-dir", ctl)
		}
		r := runIpoib(t, args...)
		t.Logf("%-60s -> rc %d %s", strings.Join(tc.args, " "), r.code, strings.TrimSuffix(r.stderr, "\n"))
		if r.code != 2 || r.stderr != tc.line || r.stdout != "" {
			t.Errorf("ipoib %v: exit %d stdout %q stderr\n%q\nwant exit 2, no stdout, stderr\n%q", args, r.code, short(r.stdout), short(r.stderr), tc.line)
		}
		if left := netnsWithPrefix(t, nsPrefix); len(left) > 0 {
			t.Errorf("ipoib %v created namespaces %v before failing", args, left)
			removeNetns(t, left)
		}
		for _, p := range []string{ctl, markers, prof, pcap, filepath.Join("/sys/class/net", dev)} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("ipoib %v created %s before failing", args, p)
				if !strings.HasPrefix(p, "/sys/") {
					os.RemoveAll(p)
				}
			}
		}
	}
}
