package cli

import (
	"context"
	"log/slog"
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

// The limits and --allow reach UpOptions; bad values are one usage line.
func TestUpAllowAndLimitFlags(t *testing.T) {
	var got UpOptions
	env := Env{Euid: func() int { return 0 }, Up: func(_ context.Context, o UpOptions, _ *slog.Logger) error {
		got = o
		return nil
	}}
	base := []string{"up", "--addr", "10.77.0.1/24", "--bind", "127.0.0.1", "--control-dir", t.TempDir()}
	r := runCLI(t, env, append(base, "--allow", "127.0.0.0/8,192.0.2.9", "--max-rx-conns", "64",
		"--max-rx-conns-per-peer", "2", "--max-half-open", "16")...)
	if r.code != ExitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("192.0.2.9/32")}
	if !slices.Equal(got.Allow, want) || got.MaxRXConns != 64 || got.MaxRXConnsPerPeer != 2 || got.MaxHalfOpen != 16 {
		t.Fatalf("options %+v", got)
	}
	if r := runCLI(t, env, base...); r.code != ExitOK || got.Allow != nil || got.MaxRXConns != 2048 {
		t.Fatalf("defaults: exit %d, allow %v, max %d", r.code, got.Allow, got.MaxRXConns)
	}
	for _, bad := range [][]string{{"--allow", "fd00::/8"}, {"--allow", "x"}, {"--max-rx-conns", "0"}, {"--max-half-open", "-1"}} {
		r := runCLI(t, env, append(base, bad...)...)
		if lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n"); r.code != ExitUsage || len(lines) != 1 {
			t.Errorf("%v: exit %d, stderr %q", bad, r.code, r.stderr)
		}
	}
}
