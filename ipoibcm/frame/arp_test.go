package frame

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// frame4ARP is a worked example IPoIB ARP body (docs/wire.md §1): 192.0.2.1
// (UD QPN 0x48, GID ::ffff:127.0.0.1, 'C' set) asks for 192.0.2.2.
const frame4ARP = "0020" + "0800" + "14" + "04" + "0001" +
	"8000004800000000000000000000ffff7f000001" + "c0000201" +
	"0000000000000000000000000000000000000000" + "c0000202"

func TestIPoIBARPGolden(t *testing.T) {
	req := IPoIBARP{
		ARP: ARP{
			Op:       ARPRequest,
			SenderIP: netip.MustParseAddr("192.0.2.1"),
			TargetIP: netip.MustParseAddr("192.0.2.2"),
		},
		SenderHW: NewHWAddr(FlagRC, 0x48, gidOf("127.0.0.1")),
	}
	var b [IPoIBARPLen + 4]byte
	if n := req.Marshal(b[:]); n != IPoIBARPLen {
		t.Fatalf("Marshal returned %d", n)
	}
	want := mustHex(t, frame4ARP)
	if !bytes.Equal(b[:IPoIBARPLen], want) {
		t.Fatalf("Marshal:\n got % x\nwant % x", b[:IPoIBARPLen], want)
	}
	got, err := ParseIPoIBARP(want)
	if err != nil || got != req {
		t.Fatalf("ParseIPoIBARP = %+v, %v", got, err)
	}
	if !got.SenderHW.Connected() || got.SenderHW.QPN() != 0x48 || !got.TargetHW.IsZero() {
		t.Fatalf("sender %s target %s", got.SenderHW, got.TargetHW)
	}
	if n := req.Marshal(b[:IPoIBARPLen-1]); n != 0 {
		t.Fatalf("Marshal into short buffer returned %d", n)
	}
}

func TestEthARPRoundTripAndTranslate(t *testing.T) {
	hostMAC := MAC{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	req := EthARP{
		ARP: ARP{
			Op:       ARPRequest,
			SenderIP: netip.MustParseAddr("192.0.2.1"),
			TargetIP: netip.MustParseAddr("192.0.2.2"),
		},
		SenderMAC: hostMAC,
	}
	// Ethernet frames are padded to 60 bytes: padding must be ignored.
	b := make([]byte, 46)
	if n := req.Marshal(b); n != EthARPLen {
		t.Fatalf("Marshal returned %d", n)
	}
	want := mustHex(t, "0001080006040001"+"525400123456"+"c0000201"+"000000000000"+"c0000202")
	if !bytes.Equal(b[:EthARPLen], want) {
		t.Fatalf("Marshal:\n got % x\nwant % x", b[:EthARPLen], want)
	}
	if n := req.Marshal(b[:EthARPLen-1]); n != 0 {
		t.Fatalf("Marshal into short buffer returned %d", n)
	}
	got, err := ParseEthARP(b)
	if err != nil || got != req {
		t.Fatalf("ParseEthARP = %+v, %v", got, err)
	}

	// Host request → IB request → IB reply → host reply.
	own := NewHWAddr(FlagRC, 0x48, gidOf("127.0.0.1"))
	ib := got.ToIPoIB(own, HWAddr{})
	var wire [IPoIBARPLen]byte
	ib.Marshal(wire[:])
	if !bytes.Equal(wire[:], mustHex(t, frame4ARP)) {
		t.Fatalf("translated request differs from frame 4: % x", wire)
	}
	peer := NewHWAddr(FlagRC, 0x49, gidOf("127.0.0.2"))
	reply := IPoIBARP{ARP: ARP{Op: ARPReply, SenderIP: ib.TargetIP, TargetIP: ib.SenderIP}, SenderHW: peer, TargetHW: own}
	reply.Marshal(wire[:])
	parsed, err := ParseIPoIBARP(wire[:])
	if err != nil {
		t.Fatal(err)
	}
	hostReply := parsed.ToEthernet(LocalMAC(3), hostMAC)
	if hostReply.Op != ARPReply || hostReply.SenderMAC != LocalMAC(3) || hostReply.TargetMAC != hostMAC ||
		hostReply.SenderIP != netip.MustParseAddr("192.0.2.2") || hostReply.TargetIP != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("host reply %+v", hostReply)
	}
}

func TestARPRejects(t *testing.T) {
	good := mustHex(t, frame4ARP)
	mutate := func(off int, v byte) []byte {
		b := bytes.Clone(good)
		b[off] = v
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", good[:55], ErrTruncated},
		{"hw type 1", mutate(1, 1), ErrARPFormat},
		{"proto IPv6", mutate(2, 0x86), ErrARPFormat},
		{"hln 6", mutate(4, 6), ErrARPFormat},
		{"pln 16", mutate(5, 16), ErrARPFormat},
		{"op 3 (RARP)", mutate(7, 3), ErrARPOp},
	} {
		if _, err := ParseIPoIBARP(c.b); !errors.Is(err, c.want) {
			t.Errorf("IPoIB %s: err = %v, want %v", c.name, err, c.want)
		}
	}
	// An IPoIB body is not an Ethernet one and vice versa.
	if _, err := ParseEthARP(good); !errors.Is(err, ErrARPFormat) {
		t.Errorf("ParseEthARP(IPoIB body) err = %v", err)
	}
	if _, err := ParseEthARP(make([]byte, EthARPLen-1)); !errors.Is(err, ErrTruncated) {
		t.Errorf("ParseEthARP(short) err = %v", err)
	}
}

func TestARPMarshalNonIPv4(t *testing.T) {
	// ARP carries only IPv4: a zero or IPv6 address becomes 0.0.0.0, the
	// marshaller must not panic.
	a := EthARP{ARP: ARP{Op: ARPReply, TargetIP: netip.MustParseAddr("2001:db8::1")}}
	b := bytes.Repeat([]byte{0xee}, EthARPLen)
	a.Marshal(b)
	if !bytes.Equal(b[14:18], []byte{0, 0, 0, 0}) || !bytes.Equal(b[24:28], []byte{0, 0, 0, 0}) {
		t.Fatalf("addresses % x / % x", b[14:18], b[24:28])
	}
}

func FuzzParseIPoIBARP(f *testing.F) {
	f.Add(mustHex(f, frame4ARP))
	f.Add(make([]byte, IPoIBARPLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseIPoIBARP(b)
		if err != nil {
			return
		}
		var out [IPoIBARPLen]byte
		if n := a.Marshal(out[:]); n != IPoIBARPLen || !bytes.Equal(out[:], b[:IPoIBARPLen]) {
			t.Fatalf("round trip: % x != % x", out, b[:IPoIBARPLen])
		}
	})
}

func FuzzParseEthARP(f *testing.F) {
	f.Add(mustHex(f, "0001080006040001525400123456c0000201000000000000c0000202"))
	f.Add(make([]byte, EthARPLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseEthARP(b)
		if err != nil {
			return
		}
		var out [EthARPLen]byte
		if n := a.Marshal(out[:]); n != EthARPLen || !bytes.Equal(out[:], b[:EthARPLen]) {
			t.Fatalf("round trip: % x != % x", out, b[:EthARPLen])
		}
	})
}
