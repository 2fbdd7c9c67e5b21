package wire

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func examplePackets(t *testing.T) [][]byte {
	a := netip.MustParseAddrPort("127.0.0.1:49153")
	b := netip.MustParseAddrPort("127.0.0.2:4791")
	ipoib := append([]byte{0x08, 0x00, 0, 0}, make([]byte, 33)...) // 37 bytes: PadCnt 3
	specs := []struct {
		src, dst netip.AddrPort
		spec     PacketSpec
	}{
		{a, b, PacketSpec{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 1, PSN: 1},
			DETH: DETH{QKey: 0x80010000, SrcQP: 1}, Payload: make([]byte, 256)}},
		{a, b, PacketSpec{BTH: BTH{Opcode: OpRCSendOnly, PKey: 0xffff, DestQP: 0x202, AckReq: true, PSN: 0xabcd},
			Payload: ipoib}},
		{b, a, PacketSpec{BTH: BTH{Opcode: OpRCAck, PKey: 0xffff, DestQP: 0x101, PSN: 0xabcd},
			AETH: AETH{Syndrome: SyndromeACK, MSN: 1}}},
	}
	var frames [][]byte
	for _, s := range specs {
		f, err := AppendFrame(nil, s.src, s.dst, AppendPacket(nil, &s.spec), true)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	return frames
}

func TestWritePcapLayout(t *testing.T) {
	var buf bytes.Buffer
	frames := examplePackets(t)
	if err := WritePcap(&buf, LinkTypeEthernet, frames); err != nil {
		t.Fatal(err)
	}
	out := buf.Bytes()
	if binary.LittleEndian.Uint32(out) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(out[20:]) != LinkTypeEthernet {
		t.Fatalf("file header % x", out[:24])
	}
	off := 24
	for i, f := range frames {
		n := int(binary.LittleEndian.Uint32(out[off+8:]))
		if n != len(f) || !bytes.Equal(out[off+16:off+16+n], f) {
			t.Fatalf("record %d mismatch", i)
		}
		off += 16 + n
	}
	if off != len(out) {
		t.Fatalf("trailing bytes: %d of %d", off, len(out))
	}
}

// TestPcapDecodesInTshark has tshark, an independent decoder, read what
// the frame builder writes.
func TestPcapDecodesInTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not in PATH: apt-get install tshark")
	}
	path := filepath.Join(t.TempDir(), "roce.pcap")
	var buf bytes.Buffer
	if err := WritePcap(&buf, LinkTypeEthernet, examplePackets(t)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tshark, "-n", "-o", "udp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-r", path, "-T", "fields", "-E", "separator=|",
		"-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn",
		// checksum status 1 = good.
		"-e", "infiniband.bth.padcnt", "-e", "infiniband.deth.q_key", "-e", "infiniband.aeth.syndrome",
		"-e", "ip.checksum.status", "-e", "udp.checksum.status").CombinedOutput()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var got []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "Running as") && l != "" {
			got = append(got, l)
		}
	}
	want := []string{
		"100|0x000001|1|0|0x0000000080010000||1|1",
		"4|0x000202|43981|3|||1|1",
		"17|0x000101|43981|0||31|1|1",
	}
	if len(got) != len(want) {
		t.Fatalf("tshark lines:\n%s", out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frame %d: tshark %q, want %q", i+1, got[i], want[i])
		}
	}
}
