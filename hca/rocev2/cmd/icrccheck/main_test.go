package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

func writeCapture(t *testing.T, corrupt bool) string {
	t.Helper()
	spec := wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCSendOnly, PKey: 0xFFFF, DestQP: 0x11, AckReq: true, PSN: 7},
		Payload: []byte{0x08, 0x00, 0, 0, 0x45}}
	frame, err := wire.AppendFrame(nil, netip.MustParseAddrPort("10.0.0.1:4791"), netip.MustParseAddrPort("10.0.0.2:4791"),
		wire.AppendPacket(nil, &spec), true)
	if err != nil {
		t.Fatal(err)
	}
	frames := [][]byte{frame, bytes.Clone(frame)}
	if corrupt {
		frames[1][len(frames[1])-1] ^= 0x80
	}
	var buf bytes.Buffer
	if err := wire.WritePcap(&buf, wire.LinkTypeEthernet, frames); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(t.TempDir(), "c.pcap")
	if err := os.WriteFile(name, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestRun(t *testing.T) {
	good, bad := writeCapture(t, false), writeCapture(t, true)
	var out, errb bytes.Buffer
	if code := run([]string{good}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "rocev2 2, icrc ok 2, icrc bad 0") {
		t.Fatalf("good: %d %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{good, bad}, &out, &errb); code != exitMismatch || !strings.Contains(out.String(), "icrc ok 1, icrc bad 1, malformed 0, other 0; first failure: frame 2: ICRC mismatch") {
		t.Fatalf("bad: %d %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"-port", "5000", good}, &out, &errb); code != exitMismatch {
		t.Fatalf("no RoCEv2 on port 5000 must fail, got %d %q", code, out.String())
	}
	if code := run([]string{"-port", "5000", "-allow-empty", good}, &out, &errb); code != exitOK {
		t.Fatalf("-allow-empty: %d", code)
	}
	if code := run(nil, &out, &errb); code != exitUsage {
		t.Fatalf("no args: %d", code)
	}
	if code := run([]string{filepath.Join(t.TempDir(), "missing.pcap")}, &out, &errb); code != exitUsage {
		t.Fatalf("missing file: %d", code)
	}
}
