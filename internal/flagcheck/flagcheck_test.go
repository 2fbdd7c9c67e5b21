package flagcheck

import (
	"net"
	"strings"
	"testing"
)

func TestPKey(t *testing.T) {
	for in, want := range map[string]uint16{"0x8001": 0x8001, "0x0001": 1, "32770": 0x8002, "0xffff": 0xffff, " 0x7fff ": 0x7fff, "010": 8} {
		if got, msg := PKey("P_Key", in); msg != "" || got != want {
			t.Errorf("PKey(%q) = %#x, %q; want %#x", in, got, msg, want)
		}
	}
	for _, in := range []string{"", "0", "0x0", "0x8000", "32768", "0x10000", "-1", "pkey", "0x8001x"} {
		if _, msg := PKey("P_Key", in); msg == "" || !strings.HasPrefix(msg, "P_Key") {
			t.Errorf("PKey(%q) accepted (%q)", in, msg)
		}
	}
}

func FuzzPKey(f *testing.F) {
	for _, s := range []string{"0x8001", "0", "0x8000", "65535", "0x1_0000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, msg := PKey("P_Key", s)
		if msg == "" && k&0x7FFF == 0 {
			t.Fatalf("PKey(%q) = %#x accepted", s, k)
		}
		if msg != "" && (k != 0 || strings.Contains(msg, "\n")) {
			t.Fatalf("PKey(%q): %#x with message %q", s, k, msg)
		}
	})
}

func TestListenAddr(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:9101", ":9101", "[::1]:0", "localhost:6060", "metrics.example.org:80", "0.0.0.0:65535"} {
		if msg := ListenAddr("metrics", ok); msg != "" {
			t.Errorf("ListenAddr(%q) = %q", ok, msg)
		}
	}
	for _, bad := range []string{"", "notanaddr", "9101", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:http", "::1:9101", "bad host:1", "-x:1", "a..b:1", "1.2.3.4:00"} {
		want := `--metrics "` + bad + `": want HOST:PORT, e.g. 127.0.0.1:9101`
		if msg := ListenAddr("metrics", bad); msg != want {
			t.Errorf("ListenAddr(%q) = %q, want %q", bad, msg, want)
		}
	}
}

func FuzzListenAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:9101", ":0", "[fe80::1%eth0]:80", "notanaddr", "a.b:-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		msg := ListenAddr("metrics", s)
		if msg == "" {
			// What it accepts, net.Listen can at least parse: a port
			// that is a number and a host of one piece.
			host, port, err := net.SplitHostPort(s)
			if err != nil || port == "" || strings.ContainsAny(host, " /") {
				t.Fatalf("ListenAddr(%q) accepted", s)
			}
		} else if strings.Contains(msg, "\n") && !strings.Contains(s, "\n") {
			t.Fatalf("ListenAddr(%q): message of two lines %q", s, msg)
		}
	})
}
