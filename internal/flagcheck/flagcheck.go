// Package flagcheck holds the bounds and messages of the flags that several
// ipoib commands share (cmd/ipoib/internal/cli, and bench's soak, which
// parses its own), so one flag has one set of bounds and one message
// everywhere. Each check returns "" or a one-line usage message; commands
// run them before they create anything (namespace, TAP, socket, profile
// file).
package flagcheck

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// IP MTU bounds. 576 is the smallest datagram every IPv4 host must accept
// (RFC 1122 §3.3.2); 65520 is IPoIB-CM's largest (RFC 4755 §4, Linux's
// IPOIB_CM_MTU). Datagram mode carries one IB packet: IB MTU minus the
// 4-byte IPoIB header (RFC 4391 §4).
const (
	MinIPMTU        = 576
	MaxConnectedMTU = 65520
	IPoIBHeaderLen  = 4
)

// MTU validates --mtu for the initial mode on a port of ibMTU bytes. 0
// means the mode's default. An MTU the mode cannot carry is refused, not
// silently lowered: the user asked for one number and would get another.
func MTU(mode string, mtu, ibMTU int) string {
	if mtu == 0 {
		return ""
	}
	max := MaxConnectedMTU
	if mode == "datagram" {
		max = ibMTU - IPoIBHeaderLen
	}
	if mtu < MinIPMTU || mtu > max {
		return fmt.Sprintf("--mtu %d: want 0 (the mode's default) or %d..%d in %s mode", mtu, MinIPMTU, max, mode)
	}
	return ""
}

// IfnameMax is the longest interface name the kernel keeps (IFNAMSIZ 16
// with its NUL); a longer one it cuts, and logs would name a device that
// does not exist.
const IfnameMax = 15

// Ifname validates an interface name flag the way the kernel's
// dev_valid_name does.
func Ifname(flagName, name string) string {
	if name == "" || len(name) > IfnameMax || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return fmt.Sprintf("--%s %q: want an interface name of 1..%d bytes without '/', ':' or spaces", flagName, name, IfnameMax)
	}
	return ""
}

// OnOff validates a switch flag spelled on or off (--offloads).
func OnOff(flagName, v string) string {
	if v != "on" && v != "off" {
		return fmt.Sprintf("--%s %q: want on or off", flagName, v)
	}
	return ""
}

// Probability validates a probability flag.
func Probability(flagName string, v float64) string {
	if !(v >= 0 && v <= 1) {
		return fmt.Sprintf("--%s %v: want a probability in [0, 1]", flagName, v)
	}
	return ""
}

// Duration validates a duration flag against its least value.
func Duration(flagName string, v, least time.Duration) string {
	if v < least {
		return fmt.Sprintf("--%s %v: want at least %v", flagName, v, least)
	}
	return ""
}

// IntRange validates an integer flag.
func IntRange(flagName string, v, lo, hi int) string {
	if v < lo || v > hi {
		return fmt.Sprintf("--%s %d out of range %d..%d", flagName, v, lo, hi)
	}
	return ""
}

// UintMax validates an unsigned flag against its largest value.
func UintMax(flagName string, v, hi uint) string {
	if v > hi {
		return fmt.Sprintf("--%s %d out of range 0..%d", flagName, v, hi)
	}
	return ""
}

// First returns the first non-empty message.
func First(msgs ...string) string {
	for _, m := range msgs {
		if m != "" {
			return m
		}
	}
	return ""
}

// Set names the flags given on the command line.
func Set(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// Usage is the one line a bad command line gets: the program, the
// command, what is wrong and where the flags are described.
func Usage(cmd, msg string) string {
	return fmt.Sprintf("ipoib %s: %s (run 'ipoib %s -h')", cmd, msg, cmd)
}

// PKey parses a P_Key as Linux's create_child reads one (sscanf "%i":
// 0x-prefixed hex, 0-prefixed octal or decimal) and refuses what names no
// partition: 0x0000 and 0x8000 (IBTA 10.9.1.2) and anything above 0xffff.
// what names the value in the message ("--pkey", "P_Key").
func PKey(what, s string) (uint16, string) {
	v, err := strconv.ParseUint(strings.TrimSpace(s), 0, 32)
	if err != nil || v > 0xFFFF {
		return 0, fmt.Sprintf("%s %q: want a P_Key like 0x8001 (1..0xffff)", what, s)
	}
	if v&0x7FFF == 0 {
		return 0, fmt.Sprintf("%s 0x%04x: 0x0000 and 0x8000 are not partitions", what, v)
	}
	return uint16(v), ""
}

// ListenAddr validates an address a command listens on (--metrics,
// --pprof): HOST:PORT with HOST empty (every address), an IP address or
// a host name, and PORT a number. Checked before anything runs, a typo
// is a usage error, not a failed listen after namespaces exist.
func ListenAddr(flagName, v string) string {
	msg := fmt.Sprintf("--%s %q: want HOST:PORT, e.g. 127.0.0.1:9101", flagName, v)
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return msg
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (port != "0" && n == 0) {
		return msg
	}
	if host == "" {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	if !hostName(host) {
		return msg
	}
	return ""
}

// hostName reports whether s is spelled as a DNS host name (RFC 1123
// labels: letters, digits, hyphens inside, at most 63 bytes each).
func hostName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// LogLevels are the --log-level names, as the message for any other
// spells them.
const LogLevels = "debug, info, warn or error"
