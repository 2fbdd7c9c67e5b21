package wire

import (
	"bytes"
	"net/netip"
	"testing"
)

func FuzzParsePacket(f *testing.F) {
	f.Add(unhex(f, cnpFrame)[14+28:])
	f.Add(AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpUDSendOnly, DestQP: 1}, DETH: DETH{QKey: 1}, Payload: []byte("x")}))
	f.Add(AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpRCAck}, AETH: AETH{Syndrome: SyndromeNAKSeqErr}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := ParsePacket(b, &p); err != nil {
			if ReasonOf(err) == DropNone {
				t.Fatalf("error %v without a reason", err)
			}
			return
		}
		// A packet that parses re-encodes to the same bytes, except for
		// reserved bits (zero on encode), pad bytes and the ICRC.
		if p.BTH.PadCount != PadCount(len(p.Payload)) || p.BTH.Opcode == OpCNP {
			return // non-canonical pad count, or CNP reserved bytes
		}
		out := AppendPacket(nil, &PacketSpec{BTH: p.BTH, DETH: p.DETH, AETH: p.AETH, Payload: p.Payload})
		in := bytes.Clone(b)
		in[8] &= 0x80 // AckReq kept, resv7 dropped
		if p.BTH.Opcode == OpUDSendOnly {
			in[BTHLen+4] = 0 // DETH reserved byte
		}
		n := len(out) - ICRCLen - int(p.BTH.PadCount)
		if len(in) != len(out) || !bytes.Equal(out[:n], in[:n]) {
			t.Fatalf("re-encode\n% x\n% x", out, in)
		}
	})
}

func FuzzICRC(f *testing.F) {
	frame := unhex(f, cnpFrame)[14:]
	f.Add(frame[:20], frame[20:28], frame[28:])
	f.Add([]byte{0x60}, []byte{}, []byte{1})
	f.Fuzz(func(t *testing.T, ip, udp, pkt []byte) {
		err := CheckICRC(ip, udp, pkt)
		if err != nil && ReasonOf(err) == DropNone {
			t.Fatal("error without reason")
		}
	})
}

func TestAppendPacketNoAllocs(t *testing.T) {
	buf := make([]byte, 0, 8192)
	payload := make([]byte, 4096)
	spec := PacketSpec{BTH: BTH{Opcode: OpRCSendMiddle}, Payload: payload}
	ip := make([]byte, 20)
	udp := make([]byte, 8)
	PutIPv4Header(ip, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), 100)
	var p Packet
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendPacket(buf[:0], &spec)
		_ = PutICRC(ip, udp, b)
		_ = ParsePacket(b, &p)
		_ = CheckICRC(ip, udp, b)
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per encode/decode, want 0", allocs)
	}
}

func BenchmarkICRC(b *testing.B) {
	ip := make([]byte, IPv4HeaderLen)
	udp := make([]byte, UDPHeaderLen)
	PutIPv4Header(ip, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), 4096+28)
	PutUDPHeader(udp, 49152, RoCEv2Port, 4096+20)
	pkt := AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpRCSendMiddle}, Payload: make([]byte, 4096)})
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		if err := PutICRC(ip, udp, pkt); err != nil {
			b.Fatal(err)
		}
	}
}
