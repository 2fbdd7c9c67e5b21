package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

var schema = Schema{"dev": String, "peers": List, "udp-offload": Bool, "mtu": Int, "port": Uint, "loss": Float, "ack-timeout": Duration}

func TestParse(t *testing.T) {
	f, err := Parse("t.conf", []byte(`dev = "ib0"
peers = ["a", "b"]
udp-offload = false
mtu = 9000
port = 4791
loss = 0.5
ack-timeout = "20ms"

[[child]]
pkey = 0x8001
name = "ib0.x"
addrs = ["10.0.0.1/24"]

[[child]]
pkey = "0x0002"
`), schema)
	if err != nil {
		t.Fatal(err)
	}
	want := []Setting{{"dev", "ib0", 1}, {"peers", "a,b", 2}, {"udp-offload", "false", 3}, {"mtu", "9000", 4},
		{"port", "4791", 5}, {"loss", "0.5", 6}, {"ack-timeout", "20ms", 7}}
	if len(f.Settings) != len(want) {
		t.Fatalf("settings %v", f.Settings)
	}
	for i, s := range want {
		if f.Settings[i] != s {
			t.Errorf("setting %d = %+v, want %+v", i, f.Settings[i], s)
		}
	}
	if len(f.Children) != 2 || f.Children[0].PKey != 0x8001 || f.Children[0].Line != 9 || f.Children[0].Name != "ib0.x" ||
		f.Children[0].Addrs[0] != netip.MustParsePrefix("10.0.0.1/24") || f.Children[1].PKey != 2 || f.Children[1].Line != 14 {
		t.Fatalf("children %+v", f.Children)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"port = -1\n", "t.conf:1: port: -1: want an integer >= 0"},
		{"loss = true\n", "t.conf:1: loss: want a number, got a boolean"},
		{"dev = \"a\"\n[table]\nx = 1\n", "t.conf:2: table: unknown key"},
		{"a.b = 1\n", "t.conf:1: a: unknown key"},
		{"peers = [\"a,b\"]\n", "t.conf:1: peers: \"a,b\": one item per string"},
		{"[child]\npkey = 1\n", "t.conf:1: child: want [[child]] (an array of tables), not [child]"},
		{"child = 3\n", "t.conf:1: child: want [[child]] tables, got an integer"},
		{"[[child]]\npkey = 1\naddrs = \"10.0.0.1/24\"\n", "t.conf:3: child[1].addrs: want an array of IP prefixes, got a string"},
		{"[[child]]\npkey = 1\nname = \"a/b\"\n", "t.conf:3: child[1].name: \"a/b\": want an interface name"},
		{"[[child]]\npkey = 1\nname = \"x\"\n[[child]]\npkey = 2\nname = \"x\"\n", "t.conf:6: child[2].name: x is also the child at line 1"},
		{"dev = 1979-05-27\n", "t.conf:1: dev: want a string, got a date or time"},
	} {
		_, err := Parse("t.conf", []byte(tc.doc), schema)
		var e *Error
		if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: got %v, want one line starting %q", tc.doc, err, tc.want)
		}
	}
}

// FuzzParse: any document gives a file or one *Error on one line with a
// line number inside the document; never a panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"dev = \"ib0\"\n", "[[child]]\npkey = 1\n", "peers = [\"a\"]\nmtu = 3\n", "a.b.c = 1", "x = [[1], {a=1}]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		_, err := Parse("f.conf", doc, schema)
		if err == nil {
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		if e.Line < 1 || e.Line > 1+strings.Count(string(doc), "\n") {
			t.Fatalf("line %d outside a document of %d lines: %v", e.Line, 1+strings.Count(string(doc), "\n"), err)
		}
	})
}
