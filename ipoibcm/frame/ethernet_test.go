package frame

import (
	"bytes"
	"errors"
	"testing"
)

func TestEncap(t *testing.T) {
	b := []byte{0xaa, 0xbb, 0xcc, 0xdd, 0xee}
	PutEncap(b, EtherTypeIPv6)
	if !bytes.Equal(b, []byte{0x86, 0xdd, 0, 0, 0xee}) {
		t.Fatalf("PutEncap wrote % x", b)
	}
	// The reserved field is ignored on receive.
	et, err := ParseEncap([]byte{0x08, 0x06, 0x12, 0x34})
	if err != nil || et != EtherTypeARP {
		t.Fatalf("ParseEncap = %#x, %v", et, err)
	}
	if _, err := ParseEncap([]byte{0x08, 0x00, 0}); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short encap: err = %v", err)
	}
}

func TestEthernetRoundTrip(t *testing.T) {
	h := EthHeader{Dst: LocalMAC(7), Src: MAC{0x52, 0x54, 0, 1, 2, 3}, EtherType: EtherTypeIPv4}
	var b [EthHdrLen + 2]byte
	PutEthernet(b[:], h)
	want := []byte{0x02, 0x1b, 0, 0, 0, 7, 0x52, 0x54, 0, 1, 2, 3, 0x08, 0x00, 0, 0}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("PutEthernet wrote % x", b)
	}
	got, err := ParseEthernet(b[:])
	if err != nil || got != h {
		t.Fatalf("ParseEthernet = %+v, %v; want %+v", got, err, h)
	}
}

func TestEthernetRejects(t *testing.T) {
	frame := func(et uint16) []byte {
		b := make([]byte, 18)
		PutEthernet(b, EthHeader{Dst: MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EtherType: et})
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", make([]byte, 13), ErrTruncated},
		{"802.1Q", frame(0x8100), ErrVLAN},
		{"802.1ad", frame(0x88a8), ErrVLAN},
		{"QinQ 0x9100", frame(0x9100), ErrVLAN},
		{"802.3 length", frame(0x05dc), ErrNotEthernetII},
	} {
		if _, err := ParseEthernet(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if h, err := ParseEthernet(frame(0x0600)); err != nil || !h.Dst.IsBroadcast() || !h.Dst.IsMulticast() {
		t.Errorf("EtherType 0x0600 rejected or dst wrong: %+v %v", h, err)
	}
}

func TestLocalMAC(t *testing.T) {
	seen := map[MAC]uint32{}
	for _, i := range []uint32{0, 1, 255, 256, 0x01000000, 0xFFFFFFFF} {
		m := LocalMAC(i)
		if m[0]&0x02 == 0 || m.IsMulticast() {
			t.Errorf("LocalMAC(%d) = %s is not locally administered unicast", i, m)
		}
		if j, dup := seen[m]; dup {
			t.Errorf("LocalMAC(%d) == LocalMAC(%d) = %s", i, j, m)
		}
		seen[m] = i
		if got, ok := LocalMACIndex(m); !ok || got != i {
			t.Errorf("LocalMACIndex(%s) = %d, %v; want %d", m, got, ok, i)
		}
		if LocalMAC(i) != m {
			t.Errorf("LocalMAC(%d) not deterministic", i)
		}
	}
	if _, ok := LocalMACIndex(MAC{0x52, 0x54, 0, 0, 0, 1}); ok {
		t.Error("LocalMACIndex accepted a foreign MAC")
	}
	if s := LocalMAC(0x0a0b0c0d).String(); s != "02:1b:0a:0b:0c:0d" {
		t.Errorf("String() = %s", s)
	}
}

func FuzzParseEthernet(f *testing.F) {
	f.Add(make([]byte, EthHdrLen))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0, 5})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x86, 0xdd, 0x60})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseEthernet(b)
		if err != nil {
			return
		}
		var out [EthHdrLen]byte
		PutEthernet(out[:], h)
		if !bytes.Equal(out[:], b[:EthHdrLen]) {
			t.Fatalf("round trip: % x != % x", out, b[:EthHdrLen])
		}
	})
}

func BenchmarkParseEthernet(b *testing.B) {
	frame := make([]byte, 1514)
	PutEthernet(frame, EthHeader{Dst: LocalMAC(1), Src: LocalMAC(2), EtherType: EtherTypeIPv4})
	b.SetBytes(EthHdrLen)
	b.ReportAllocs()
	var sink uint16
	for b.Loop() {
		h, err := ParseEthernet(frame)
		if err != nil {
			b.Fatal(err)
		}
		sink += h.EtherType
	}
	_ = sink
}

func BenchmarkPutEncap(b *testing.B) {
	buf := make([]byte, EncapLen)
	b.SetBytes(EncapLen)
	b.ReportAllocs()
	for b.Loop() {
		PutEncap(buf, EtherTypeIPv4)
	}
}
