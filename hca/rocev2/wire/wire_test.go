package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"net/netip"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The RoCEv2 CNP a ConnectX-4 Lx sent (scapy test/contrib/roce.uts): its
// wire ICRC bytes are 82 fd 00 2a. The frame's IPv4 ID is 0x718c and TOS
// 0xc2, which also proves the ID is covered and the TOS masked.
const cnpFrame = `e41d2dab2bc2 7cfe90643b32 0800
	45c2 003c 718c 4000 4011 9161 0a00 1101 0a00 1201
	0000 12b7 0028 0000
	8100 ffff 4000 0118 0000 0000
	0000 0000 0000 0000 0000 0000 0000 0000
	82fd 002a`

func TestICRCGoldenConnectX4CNP(t *testing.T) {
	f := unhex(t, cnpFrame)[14:]
	ip, udp, pkt := f[:20], f[20:28], f[28:]
	if err := CheckICRC(ip, udp, pkt); err != nil {
		t.Fatalf("CheckICRC: %v", err)
	}
	c, err := ICRC(ip, udp, pkt[:len(pkt)-4])
	if err != nil {
		t.Fatal(err)
	}
	var got [4]byte
	binary.LittleEndian.PutUint32(got[:], c)
	if want := [4]byte{0x82, 0xfd, 0x00, 0x2a}; got != want {
		t.Fatalf("ICRC wire bytes % x, want % x", got, want)
	}
	var p Packet
	if err := ParsePacket(pkt, &p); err != nil {
		t.Fatalf("ParsePacket: %v", err)
	}
	if p.BTH.Opcode != OpCNP || p.BTH.DestQP != 0x118 || p.BTH.Resv8a != 0x40 || p.BTH.PKey != 0xffff {
		t.Fatalf("BTH = %+v", p.BTH)
	}
	// Variant fields must not change the ICRC; invariant ones must.
	ip2 := bytes.Clone(ip)
	ip2[1], ip2[8], ip2[10] = 0, 1, 0x55
	pkt2 := bytes.Clone(pkt)
	pkt2[4] = 0
	if err := CheckICRC(ip2, udp, pkt2); err != nil {
		t.Fatalf("masked fields changed the ICRC: %v", err)
	}
	ip2[5] ^= 1 // Identification
	if err := CheckICRC(ip2, udp, pkt2); !errors.Is(err, DropBadICRC) {
		t.Fatalf("changed IP ID: got %v, want DropBadICRC", err)
	}
}

// scapy's UC SEND_ONLY example (roce.uts "RoCE layer"): ICRC field 0x78f353f3.
func TestICRCGoldenScapyUC(t *testing.T) {
	payload := []byte("F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00")
	ip := unhex(t, "4501 0040 0478 4000 4011 0000 c0a8 0007 c0a8 0007")
	binary.BigEndian.PutUint16(ip[10:], 0xb4d5)
	udp := unhex(t, "c000 12b7 002c aca2")
	pkt := make([]byte, 12+len(payload)+4)
	bth := BTH{Opcode: 0x24, MigReq: true, PadCount: 2, PKey: 0xffff, DestQP: 211, PSN: 13571856}
	bth.Encode(pkt)
	copy(pkt[12:], payload)
	if err := PutICRC(ip, udp, pkt); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint32(pkt[len(pkt)-4:]); got != 0x78f353f3 {
		t.Fatalf("ICRC field %#08x, want 0x78f353f3", got)
	}
}

func TestICRCIPv6MasksFlowLabel(t *testing.T) {
	src := netip.MustParseAddrPort("[fe80::1]:49224")
	dst := netip.MustParseAddrPort("[ff12:401b:ffff::ffff:ffff]:4791")
	spec := PacketSpec{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0xffffff},
		DETH: DETH{QKey: 0xb1b, SrcQP: 0x48}, Payload: []byte{8, 6, 0, 0, 1}}
	f, err := AppendFrame(nil, src, dst, AppendPacket(nil, &spec), false)
	if err != nil {
		t.Fatal(err)
	}
	ip, udp, pkt := f[:40], f[40:48], f[48:]
	ip[1], ip[2], ip[3], ip[7] = 0x05, 0x78, 0x0b, 3 // kernel-chosen flow label, hop limit
	if err := CheckICRC(ip, udp, pkt); err != nil {
		t.Fatalf("IPv6 flow label/hop limit not masked: %v", err)
	}
	ip[8] ^= 1
	if err := CheckICRC(ip, udp, pkt); !errors.Is(err, DropBadICRC) {
		t.Fatalf("changed source address: got %v", err)
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	in := BTH{Opcode: OpRCSendLast, SE: true, PadCount: 3, PKey: 0x8001, Resv8a: 0x80,
		DestQP: 0xABCDEF, AckReq: true, PSN: 0xFFFFFF}
	var b [BTHLen]byte
	in.Encode(b[:])
	if want := unhex(t, "02b0 8001 80abcdef 80ffffff"); !bytes.Equal(b[:], want) {
		t.Fatalf("BTH bytes % x, want % x", b, want)
	}
	var out BTH
	if err := out.Decode(b[:]); err != nil || out != in {
		t.Fatalf("BTH round trip: %+v, %v", out, err)
	}
	d := DETH{QKey: QKeyGSITest, SrcQP: 1}
	var db [DETHLen]byte
	d.Encode(db[:])
	if want := unhex(t, "80010000 00000001"); !bytes.Equal(db[:], want) {
		t.Fatalf("DETH bytes % x", db)
	}
	a := AETH{Syndrome: RNRNAK(14), MSN: 7}
	var ab [AETHLen]byte
	a.Encode(ab[:])
	if want := unhex(t, "2e000007"); !bytes.Equal(ab[:], want) {
		t.Fatalf("AETH bytes % x", ab)
	}
	var a2 AETH
	_ = a2.Decode(ab[:])
	if a2.Syndrome.Kind() != KindRNRNAK || a2.Syndrome.Value() != 14 || a2.MSN != 7 {
		t.Fatalf("AETH decode %+v", a2)
	}
	if SyndromeNAKSeqErr.Kind() != KindNAK || SyndromeACK.Kind() != KindACK || SyndromeACK.Value() != 31 {
		t.Fatal("syndrome kinds")
	}
}

const QKeyGSITest = 0x80010000

func TestParsePacketErrors(t *testing.T) {
	good := AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 1},
		DETH: DETH{QKey: QKeyGSITest, SrcQP: 1}, Payload: []byte("hello")})
	var p Packet
	if err := ParsePacket(good, &p); err != nil {
		t.Fatal(err)
	}
	if string(p.Payload) != "hello" || p.BTH.PadCount != 3 || p.DETH.QKey != QKeyGSITest || len(good) != 12+8+5+3+4 {
		t.Fatalf("parsed %+v len %d", p, len(good))
	}
	cases := []struct {
		name string
		mod  func([]byte) []byte
		want DropReason
	}{
		{"empty", func(b []byte) []byte { return nil }, DropGarbage},
		{"short", func(b []byte) []byte { return b[:15] }, DropGarbage},
		{"tver", func(b []byte) []byte { b[1] |= 1; return b }, DropBadTVer},
		{"opcode", func(b []byte) []byte { b[0] = 0x0a; return b }, DropBadOpcode},
		{"no deth", func(b []byte) []byte { return append(b[:12], 0, 0, 0, 0) }, DropTruncated},
		{"pad", func(b []byte) []byte { b = append(b[:20], 0, 0, 0, 0); b[1] |= 0x30; return b }, DropBadPadCount},
	}
	for _, c := range cases {
		err := ParsePacket(c.mod(bytes.Clone(good)), &p)
		if ReasonOf(err) != c.want || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if ReasonOf(nil) != DropNone || ReasonOf(errors.New("x")) != DropGarbage {
		t.Fatal("ReasonOf")
	}
	if DropBadICRC.String() != "bad_icrc" || DropReason(200).String() != "DropReason(200)" {
		t.Fatal("DropReason.String")
	}
}

func TestUDPSourcePort(t *testing.T) {
	// 0x101*0x202 = 0x20402: low 0x0402 ^ (0x20000>>14 = 8) = 0x040a.
	if got := UDPSourcePort(0x101, 0x202); got != 0xC40A {
		t.Fatalf("UDPSourcePort = %#x, want 0xc40a", got)
	}
	for q := uint32(0); q < 5000; q += 7 {
		if p := UDPSourcePort(q, q*3+1); p < 0xC000 {
			t.Fatalf("port %#x below 0xC000", p)
		}
	}
}

func TestQPSourcePort(t *testing.T) {
	// hash_32(1, 14) = 0x61C88647 >> 18 = 0x1872 (rxe's GSI QP).
	if got := QPSourcePort(1); got != 0xD872 {
		t.Fatalf("QPSourcePort(1) = %#x, want 0xd872", got)
	}
	// UDPSourcePort is symmetric: both ends of a connection, and so the
	// data and the ACKs of one QP pair, take the same path.
	if UDPSourcePort(0x11, 0x2345) != UDPSourcePort(0x2345, 0x11) {
		t.Fatal("UDPSourcePort not symmetric")
	}
}

func TestAppendFrameIPv4Checks(t *testing.T) {
	src := netip.MustParseAddrPort("127.0.0.1:49153")
	dst := netip.MustParseAddrPort("127.0.0.2:4791")
	pkt := AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpRCAck, PKey: 0xffff, DestQP: 0x101, PSN: 0xabcd},
		AETH: AETH{Syndrome: SyndromeACK, MSN: 1}})
	f, err := AppendFrame(nil, src, dst, pkt, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 48 || f[6] != 0x40 || f[4] != 0 || f[5] != 0 {
		t.Fatalf("frame % x", f)
	}
	if !header.IPv4(f[:20]).IsChecksumValid() {
		t.Fatal("IPv4 header checksum invalid")
	}
	if u := header.UDP(f[20:]); !u.IsChecksumValid(tcpip.AddrFrom4([4]byte(f[12:16])), tcpip.AddrFrom4([4]byte(f[16:20])), checksum.Checksum(u.Payload(), 0)) {
		t.Fatalf("UDP checksum %#x invalid", u.Checksum())
	}
	if err := CheckICRC(f[:20], f[20:28], f[28:]); err != nil {
		t.Fatal(err)
	}
	if _, err := AppendFrame(nil, src, netip.MustParseAddrPort("[::1]:1"), pkt, false); err == nil {
		t.Fatal("mixed families accepted")
	}
}
