package cli

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseAllow(t *testing.T) {
	p := netip.MustParsePrefix
	for _, c := range []struct {
		in   string
		v4   bool
		want []netip.Prefix
	}{
		{"", true, nil},
		{"any", true, []netip.Prefix{p("0.0.0.0/0")}},
		{" any ", false, []netip.Prefix{p("::/0")}},
		{"10.1.2.3/8, 192.0.2.1", true, []netip.Prefix{p("10.0.0.0/8"), p("192.0.2.1/32")}},
		{"::ffff:10.0.0.0/104,::ffff:192.0.2.1", true, []netip.Prefix{p("10.0.0.0/8"), p("192.0.2.1/32")}},
		{"fd00::/64,fe80::1", false, []netip.Prefix{p("fd00::/64"), p("fe80::1/128")}},
	} {
		got, err := ParseAllow(c.in, c.v4)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseAllow(%q, %v) = %v, %v; want %v", c.in, c.v4, got, err, c.want)
		}
	}
	for _, in := range []string{"10.0.0.0/33", "bogus", ",", "fd00::/64", "fe80::1%eth0", "::ffff:10.0.0.0/64", "anything"} {
		if got, err := ParseAllow(in, true); err == nil {
			t.Errorf("ParseAllow(%q) = %v, want an error", in, got)
		}
	}
}

// FuzzParseAllow: any input gives an error or masked prefixes of the
// asked family, never a panic.
func FuzzParseAllow(f *testing.F) {
	for _, s := range []string{"", "any", "10.0.0.0/8,192.0.2.1", "::ffff:1.2.3.4/120", "fe80::1%lo", ",,", "1.2.3.4/-1"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, v4 bool) {
		got, err := ParseAllow(s, v4)
		if err != nil {
			if got != nil {
				t.Fatalf("error %v with prefixes %v", err, got)
			}
			return
		}
		for _, p := range got {
			if !p.IsValid() || p.Addr().Is4() != v4 || p != p.Masked() || p.Addr().Zone() != "" {
				t.Fatalf("ParseAllow(%q, %v) gave %v", s, v4, p)
			}
		}
	})
}

// --allow and the limits are validated with the other flags, before
// anything is created: good values pass on to the root check, bad ones
// are one usage line naming the flag.
func TestUpAllowAndLimitFlags(t *testing.T) {
	base := []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--control-dir", t.TempDir()}
	r := runCLI(t, Env{}, append(base, "--allow", "127.0.0.0/8,192.0.2.9", "--max-rx-conns", "64",
		"--max-rx-conns-per-peer", "2", "--max-half-open", "16")...)
	if r.code != ExitUsage || !strings.Contains(r.stderr, "needs root") {
		t.Fatalf("valid flags: exit %d, stderr %q (want the root check)", r.code, r.stderr)
	}
	for _, bad := range [][]string{{"--allow", "fd00::/8"}, {"--allow", "x"}, {"--max-rx-conns", "0"},
		{"--max-rx-conns-per-peer", "0"}, {"--max-half-open", "-1"}} {
		r := runCLI(t, Env{}, append(base, bad...)...)
		lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
		if r.code != ExitUsage || len(lines) != 1 || !strings.Contains(r.stderr, bad[0]) {
			t.Errorf("%v: exit %d, stderr %q", bad, r.code, r.stderr)
		}
	}
}

// The default allow list is the peers plus the subnet the bind address
// is on: on loopback, 127.0.0.1 is on 127.0.0.0/8.
func TestDefaultAllow(t *testing.T) {
	peer := netip.MustParseAddr("192.0.2.7")
	got, err := defaultAllow(netip.MustParseAddr("127.0.0.1"), []netip.Addr{peer})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("127.0.0.0/8")}
	if !slices.Equal(got, want) {
		t.Fatalf("default allow %v, want %v", got, want)
	}
	// 127.78.0.1 is on lo's 127.0.0.0/8 without being its address.
	if got, err := defaultAllow(netip.MustParseAddr("127.78.0.1"), nil); err != nil || !slices.Equal(got, want[1:]) {
		t.Fatalf("default allow for a loopback address: %v, %v", got, err)
	}
	// 198.18.0.0/15 is for benchmarks between networks: on no interface
	// here.
	if _, err := defaultAllow(netip.MustParseAddr("198.19.254.253"), nil); err == nil {
		t.Fatal("a bind address on no interface gave a default")
	}
}
