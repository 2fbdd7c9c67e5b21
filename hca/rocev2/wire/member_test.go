package wire

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
)

func TestMemberMADRoundTrip(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		var addrs []netip.Addr
		for i := range 100 {
			if v6 {
				addrs = append(addrs, netip.AddrFrom16([16]byte{0xfd, 15: byte(i)}))
			} else {
				addrs = append(addrs, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
			}
		}
		in := MemberMAD{Method: MemberGetResp, TID: 0x0102030405060708, Offset: 7, Total: 100, V6: v6, Addrs: addrs}
		b := make([]byte, MemberMADLen)
		if n := PutMemberMAD(b, &in); n != MemberMADLen || !IsMemberMAD(b) {
			t.Fatalf("v6 %v: put %d bytes, IsMemberMAD %v", v6, n, IsMemberMAD(b))
		}
		out := MemberMAD{Addrs: make([]netip.Addr, 0, MaxMemberAddrs(true)*4)}
		if err := ParseMemberMAD(b, &out); err != nil {
			t.Fatal(err)
		}
		want := addrs[:MaxMemberAddrs(v6)]
		if out.Method != in.Method || out.TID != in.TID || out.Offset != 7 || out.Total != 100 || out.V6 != v6 || !slices.Equal(out.Addrs, want) {
			t.Fatalf("v6 %v: round trip %+v", v6, out)
		}
	}
	if MaxMemberAddrs(false) != 56 || MaxMemberAddrs(true) != 14 {
		t.Fatalf("capacity %d/%d", MaxMemberAddrs(false), MaxMemberAddrs(true))
	}
}

func TestMemberMADRejects(t *testing.T) {
	good := make([]byte, MemberMADLen)
	PutMemberMAD(good, &MemberMAD{Method: MemberGet, Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	for name, mut := range map[string]func(b []byte) []byte{
		"short":        func(b []byte) []byte { return b[:MemberMADLen-1] },
		"base version": func(b []byte) []byte { b[0] = 2; return b },
		"class":        func(b []byte) []byte { b[1] = 0x07; return b },
		"method":       func(b []byte) []byte { b[3] = 0x02; return b },
		"status":       func(b []byte) []byte { b[5] = 1; return b },
		"attribute":    func(b []byte) []byte { b[17] = 0x02; return b },
		"version":      func(b []byte) []byte { b[24] = 2; return b },
		"addr length":  func(b []byte) []byte { b[25] = 8; return b },
		"count":        func(b []byte) []byte { b[28] = 57; return b },
	} {
		b := mut(bytes.Clone(good))
		m := MemberMAD{Addrs: make([]netip.Addr, 0, 56)}
		if err := ParseMemberMAD(b, &m); ReasonOf(err) == DropNone {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzMemberMAD(f *testing.F) {
	b := make([]byte, MemberMADLen)
	PutMemberMAD(b, &MemberMAD{Method: MemberGetResp, TID: 9, Total: 2, Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}})
	f.Add(b)
	b6 := make([]byte, MemberMADLen)
	PutMemberMAD(b6, &MemberMAD{Method: MemberGet, V6: true, Addrs: []netip.Addr{netip.MustParseAddr("fd00::1")}})
	f.Add(b6)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m := MemberMAD{Addrs: make([]netip.Addr, 0, MaxMemberAddrs(false))}
		if err := ParseMemberMAD(b, &m); err != nil {
			if ReasonOf(err) == DropNone {
				t.Fatalf("error %v without a reason", err)
			}
			return
		}
		if len(m.Addrs) > MaxMemberAddrs(m.V6) {
			t.Fatalf("%d addresses", len(m.Addrs))
		}
		// What parses re-encodes to what parses the same.
		out := make([]byte, MemberMADLen)
		PutMemberMAD(out, &m)
		m2 := MemberMAD{Addrs: make([]netip.Addr, 0, MaxMemberAddrs(false))}
		if err := ParseMemberMAD(out, &m2); err != nil {
			t.Fatalf("re-encoded MAD does not parse: %v", err)
		}
		if m2.Method != m.Method || m2.TID != m.TID || m2.Offset != m.Offset || m2.Total != m.Total || m2.V6 != m.V6 || !slices.Equal(m2.Addrs, m.Addrs) {
			t.Fatalf("re-encode changed %+v to %+v", m, m2)
		}
	})
}
