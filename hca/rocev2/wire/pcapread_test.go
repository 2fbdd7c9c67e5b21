package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"testing"
	"time"
)

func TestCheckPcapICRC(t *testing.T) {
	frames := examplePackets(t)
	var buf bytes.Buffer
	if err := WritePcap(&buf, LinkTypeEthernet, frames); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	rep, err := CheckPcapICRC(bytes.NewReader(good), RoCEv2Port)
	if err != nil || !rep.OK() || rep.Frames != 3 || rep.Good != 3 || rep.Bad != 0 {
		t.Fatalf("clean capture: %v %v", rep, err)
	}

	// One flipped payload bit in frame 2 is an ICRC mismatch there.
	bad := bytes.Clone(good)
	off := 24 + 16 + len(frames[0]) + 16 + 14 + IPv4HeaderLen + UDPHeaderLen + BTHLen + 5
	bad[off] ^= 0x10
	rep, err = CheckPcapICRC(bytes.NewReader(bad), RoCEv2Port)
	if err != nil || rep.OK() || rep.Bad != 1 || rep.Good != 2 || rep.FirstBad != "frame 2: ICRC mismatch" {
		t.Fatalf("corrupted capture: %v %v", rep, err)
	}

	// The ICRC masks TTL, TOS and the checksums: a router's changes keep
	// it valid.
	routed := bytes.Clone(good)
	ip := 24 + 16 + 14
	routed[ip+8]--     // TTL
	routed[ip+1] = 0x2 // ECN bits
	if rep, _ := CheckPcapICRC(bytes.NewReader(routed), RoCEv2Port); rep.Good != 3 {
		t.Fatalf("masked fields changed the verdict: %v", rep)
	}

	// Another port: nothing is RoCEv2, so the check does not pass.
	if rep, _ := CheckPcapICRC(bytes.NewReader(good), 5000); rep.RoCEv2 != 0 || rep.Other != 3 || rep.OK() {
		t.Fatalf("other port: %v", rep)
	}

	// A file cut inside a record is an error, not a silent pass.
	if _, err := CheckPcapICRC(bytes.NewReader(good[:len(good)-3]), RoCEv2Port); !errors.Is(err, ErrPcapFormat) {
		t.Fatalf("truncated file: %v", err)
	}
}

func TestPcapReaderByteOrdersAndLinkTypes(t *testing.T) {
	frames := examplePackets(t)
	raw := frames[1][14:] // strip Ethernet
	// Big-endian, nanosecond magic, raw IP link type.
	var b bytes.Buffer
	h := make([]byte, 24)
	binary.BigEndian.PutUint32(h, 0xa1b23c4d)
	binary.BigEndian.PutUint16(h[4:], 2)
	binary.BigEndian.PutUint16(h[6:], 4)
	binary.BigEndian.PutUint32(h[16:], 65535)
	binary.BigEndian.PutUint32(h[20:], LinkTypeRaw)
	b.Write(h)
	rec := make([]byte, 16)
	binary.BigEndian.PutUint32(rec[8:], uint32(len(raw)))
	binary.BigEndian.PutUint32(rec[12:], uint32(len(raw)))
	b.Write(rec)
	b.Write(raw)
	pr, err := NewPcapReader(bytes.NewReader(b.Bytes()))
	if err != nil || pr.LinkType != LinkTypeRaw {
		t.Fatalf("%v link %d", err, pr.LinkType)
	}
	data, orig, err := pr.Next()
	if err != nil || orig != len(raw) || !bytes.Equal(data, raw) {
		t.Fatalf("record: %v %d", err, orig)
	}
	if _, _, err := pr.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	rep, err := CheckPcapICRC(bytes.NewReader(b.Bytes()), RoCEv2Port)
	if err != nil || rep.Good != 1 {
		t.Fatalf("raw capture: %v %v", rep, err)
	}
	// Linux cooked capture (tshark -i any).
	sll := append(make([]byte, 14), 0x08, 0x00)
	ip, ok, err := IPPacket(LinkTypeLinuxSLL, append(sll, raw...))
	if err != nil || !ok || !bytes.Equal(ip, raw) {
		t.Fatalf("SLL: %v %v", ok, err)
	}
	// ARP over Ethernet is not IP.
	arp := bytes.Clone(frames[0][:14])
	arp[12], arp[13] = 0x08, 0x06
	if _, ok, err := IPPacket(LinkTypeEthernet, append(arp, make([]byte, 28)...)); ok || err != nil {
		t.Fatalf("ARP: %v %v", ok, err)
	}
	if _, err := NewPcapReader(bytes.NewReader([]byte{0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})); !errors.Is(err, ErrPcapFormat) {
		t.Fatalf("pcapng: %v", err)
	}
}

// FuzzCheckPcapICRC feeds arbitrary files to the capture checker: it
// returns counts or an error, never panics.
func FuzzCheckPcapICRC(f *testing.F) {
	var buf bytes.Buffer
	frames := [][]byte{{0x45}, make([]byte, 60)}
	_ = WritePcap(&buf, LinkTypeEthernet, frames)
	f.Add(buf.Bytes())
	buf.Reset()
	_ = WritePcap(&buf, LinkTypeRaw, [][]byte{{0x60, 0, 0, 0, 0, 8, 17, 64}})
	f.Add(buf.Bytes())
	f.Add(samplePcapng(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		rep, err := CheckPcapICRC(bytes.NewReader(b), RoCEv2Port)
		if err == nil && rep.Good+rep.Bad+rep.Malformed+rep.Other != rep.Frames {
			t.Fatalf("counts do not add up: %v", rep)
		}
	})
}

// FuzzRoCEv2Datagram checks the IP/UDP splitter on arbitrary packets.
func FuzzRoCEv2Datagram(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x12, 0xb7, 0x12, 0xb7, 0, 8, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ipHdr, udpHdr, payload, ok, err := RoCEv2Datagram(b, RoCEv2Port)
		if ok && (err != nil || len(udpHdr) != UDPHeaderLen || len(ipHdr)+UDPHeaderLen+len(payload) > len(b)) {
			t.Fatalf("inconsistent split: %d %d %d of %d", len(ipHdr), len(udpHdr), len(payload), len(b))
		}
	})
}

// samplePcapng is a two-interface pcapng file: a RoCEv2 frame with a
// valid ICRC on a raw-IP interface and a text record on an upper-PDU one.
func samplePcapng(tb testing.TB) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w, err := NewPcapngWriter(&buf, "test", []PcapngInterface{{Name: "fabric", LinkType: LinkTypeRaw}, {Name: "events", LinkType: LinkTypeUpperPDU}})
	if err != nil {
		tb.Fatal(err)
	}
	pkt := AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 1}, DETH: DETH{QKey: 0x80010000, SrcQP: 1}, Payload: make([]byte, 256)})
	src, dst := netip.MustParseAddrPort("[fe80::1]:49153"), netip.MustParseAddrPort("[fe80::2]:4791")
	frame, err := AppendFrame(nil, src, dst, pkt, false)
	if err != nil {
		tb.Fatal(err)
	}
	ts := time.Unix(1_700_000_000, 0)
	for _, rec := range []struct {
		iface   int
		data    []byte
		comment string
	}{{0, frame, ""}, {1, []byte("h1: reaped qpn 0x000011"), "h1: reaped qpn 0x000011"}, {0, frame, ""}} {
		if err := w.WritePacket(rec.iface, ts, rec.data, rec.comment); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestPcapngRead(t *testing.T) {
	b := samplePcapng(t)
	rep, err := CheckPcapICRC(bytes.NewReader(b), RoCEv2Port)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Frames != 3 || rep.RoCEv2 != 2 || rep.Good != 2 || rep.Other != 1 || !rep.OK() {
		t.Fatalf("pcapng: %v", rep)
	}
	// A corrupt ICRC is found in pcapng as in pcap.
	bad := bytes.Clone(b)
	i := bytes.LastIndex(bad, frameTail(t, b))
	bad[i]++
	if rep, err := CheckPcapICRC(bytes.NewReader(bad), RoCEv2Port); err != nil || rep.Bad != 1 {
		t.Fatalf("corrupted pcapng: %v %v", rep, err)
	}
	for _, cut := range []int{30, len(b) - 3} {
		if _, err := CheckPcapICRC(bytes.NewReader(b[:cut]), RoCEv2Port); err == nil {
			t.Errorf("pcapng cut at %d read without error", cut)
		}
	}
}

// frameTail returns the last 4 bytes of the first packet's ICRC as they
// sit in the file, to find and corrupt the last copy.
func frameTail(t *testing.T, b []byte) []byte {
	t.Helper()
	pr, err := NewPcapReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	data, _, err := pr.Next()
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(data[len(data)-8:])
}
