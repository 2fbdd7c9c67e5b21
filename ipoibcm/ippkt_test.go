package ipoibcm

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/offload"
)

// buildIGMP is an IPv4 packet (with the Router Alert option) carrying the
// IGMP message m.
func buildIGMP(m []byte) []byte {
	p := make([]byte, 24+len(m))
	p[0] = 0x46 // IHL 6: Router Alert option
	binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
	p[8], p[9] = 1, ipProtoIGMP
	copy(p[12:16], []byte{10, 0, 0, 1})
	copy(p[16:20], []byte{224, 0, 0, 22})
	copy(p[24:], m)
	return p
}

// buildIGMPv1v2 is an IGMPv1/v2 message of type typ for group.
func buildIGMPv1v2(typ byte, group [4]byte) []byte {
	m := make([]byte, 8)
	m[0] = typ
	copy(m[4:8], group[:])
	return buildIGMP(m)
}

func buildIGMPv2(group [4]byte) []byte { return buildIGMPv1v2(igmpV2Report, group) }

// v2Record is one IGMPv3 / MLDv2 group record.
type v2Record struct {
	typ     byte
	group   netip.Addr
	sources int
}

func marshalRecords(recs []v2Record) []byte {
	var b []byte
	for _, r := range recs {
		a := r.group.AsSlice()
		h := []byte{r.typ, 0, byte(r.sources >> 8), byte(r.sources)}
		b = append(b, h...)
		b = append(b, a...)
		b = append(b, make([]byte, len(a)*r.sources)...)
	}
	return b
}

func buildIGMPv3(recs ...v2Record) []byte {
	m := []byte{igmpV3Report, 0, 0, 0, 0, 0, byte(len(recs) >> 8), byte(len(recs))}
	return buildIGMP(append(m, marshalRecords(recs)...))
}

// buildMLD is an IPv6 packet with a hop-by-hop header carrying the
// ICMPv6 (MLD) message m.
func buildMLD(m []byte) []byte {
	p := make([]byte, 40+8+len(m))
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(8+len(m)))
	p[6], p[7] = ipv6HopByHop, 1
	p[40] = ipProtoICMPv6 // hop-by-hop: next header, length 0 (8 bytes)
	copy(p[48:], m)
	return p
}

func buildMLDv1(typ byte, group netip.Addr) []byte {
	m := make([]byte, 24)
	m[0] = typ
	a := group.As16()
	copy(m[8:24], a[:])
	return buildMLD(m)
}

func buildMLDv2Records(recs ...v2Record) []byte {
	m := []byte{mldV2Report, 0, 0, 0, 0, 0, byte(len(recs) >> 8), byte(len(recs))}
	return buildMLD(append(m, marshalRecords(recs)...))
}

// buildMLDv2 is an MLDv2 report joining groups (CHANGE_TO_EXCLUDE({})).
func buildMLDv2(groups ...netip.Addr) []byte {
	var recs []v2Record
	for _, g := range groups {
		recs = append(recs, v2Record{typ: recChangeToExclude, group: g})
	}
	return buildMLDv2Records(recs...)
}

func TestMcastReportParsing(t *testing.T) {
	g4, g4b := netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("224.9.9.9")
	g6, g6b := netip.MustParseAddr("ff05::9"), netip.MustParseAddr("ff02::1:ff00:2")
	join := func(g netip.Addr) mcastChange { return mcastChange{group: g, join: true} }
	leave := func(g netip.Addr) mcastChange { return mcastChange{group: g} }
	for _, tc := range []struct {
		name string
		et   uint16
		p    []byte
		v    mcastVerdict
		want []mcastChange
	}{
		{"IGMPv1 report", 0x0800, buildIGMPv1v2(igmpV1Report, g4.As4()), mcastReport, []mcastChange{join(g4)}},
		{"IGMPv2 report", 0x0800, buildIGMPv2(g4.As4()), mcastReport, []mcastChange{join(g4)}},
		{"IGMPv2 leave", 0x0800, buildIGMPv1v2(igmpV2Leave, g4.As4()), mcastReport, []mcastChange{leave(g4)}},
		{"IGMP query", 0x0800, buildIGMPv1v2(0x11, [4]byte{}), mcastNotReport, nil},
		{"IGMPv3 join and leave", 0x0800, buildIGMPv3(
			v2Record{typ: recChangeToExclude, group: g4},
			v2Record{typ: recChangeToInclude, group: g4b},
			v2Record{typ: recModeIsExclude, group: g4b},
			v2Record{typ: recAllowNewSources, group: g4, sources: 2},
			v2Record{typ: recBlockOldSources, group: g4, sources: 1},
			v2Record{typ: recAllowNewSources, group: g4b},
			v2Record{typ: recModeIsInclude, group: g4}),
			mcastReport, []mcastChange{join(g4), leave(g4b), join(g4b), join(g4), leave(g4)}},
		{"IGMPv3 record type 7", 0x0800, buildIGMPv3(v2Record{typ: 7, group: g4}), mcastBadReport, nil},
		{"IGMPv3 unicast group", 0x0800, buildIGMPv3(v2Record{typ: recChangeToExclude, group: netip.MustParseAddr("10.1.1.1")}), mcastBadReport, nil},
		{"IGMPv2 unicast group", 0x0800, buildIGMPv2([4]byte{10, 1, 1, 1}), mcastBadReport, nil},
		{"IGMP truncated", 0x0800, buildIGMP([]byte{igmpV2Report, 0, 0}), mcastBadReport, nil},
		{"IGMP empty", 0x0800, buildIGMP(nil), mcastBadReport, nil},
		{"MLDv1 report", 0x86DD, buildMLDv1(mldV1Report, g6), mcastReport, []mcastChange{join(g6)}},
		{"MLDv1 done", 0x86DD, buildMLDv1(mldV1Done, g6), mcastReport, []mcastChange{leave(g6)}},
		{"MLD query", 0x86DD, buildMLDv1(130, g6), mcastNotReport, nil},
		{"MLDv2", 0x86DD, buildMLDv2Records(
			v2Record{typ: recChangeToExclude, group: g6},
			v2Record{typ: recChangeToInclude, group: g6b}),
			mcastReport, []mcastChange{join(g6), leave(g6b)}},
		{"MLDv2 unicast group", 0x86DD, buildMLDv2(netip.MustParseAddr("fd00::1")), mcastBadReport, nil},
		{"MLD truncated", 0x86DD, buildMLD([]byte{mldV1Report, 0, 0, 0}), mcastBadReport, nil},
		{"not IP", 0x0806, buildIGMPv2(g4.As4()), mcastNotReport, nil},
		{"garbage", 0x0800, make([]byte, 40), mcastNotReport, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, v := parseMcastReport(tc.et, tc.p, nil)
			if v != tc.v || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v %v", got, v, tc.want, tc.v)
			}
		})
	}
	// A record count past the message is bad, and the records already
	// read are not acted on.
	p := buildIGMPv3(v2Record{typ: recChangeToExclude, group: g4})
	p[24+7] = 2
	if got, v := parseMcastReport(0x0800, p, nil); v != mcastBadReport || len(got) != 0 {
		t.Fatalf("short IGMPv3: %v %v", got, v)
	}
	// Many records are all read, whatever the scratch holds.
	var recs []v2Record
	for k := range 300 {
		recs = append(recs, v2Record{typ: recChangeToExclude, group: netip.AddrFrom4([4]byte{239, 0, byte(k >> 8), byte(k)})})
	}
	var scratch [16]mcastChange
	if got, v := parseMcastReport(0x0800, buildIGMPv3(recs...), scratch[:0]); v != mcastReport || len(got) != 300 {
		t.Fatalf("300 records: %d %v", len(got), v)
	}
	if sn := solicitedNode(netip.MustParseAddr("fd00::1:2:3")); sn != netip.MustParseAddr("ff02::1:ff02:3") {
		t.Fatalf("solicited-node = %v", sn)
	}
	mac, ok := hostMulticastMAC(0x0800, buildIGMPv1v2(igmpV2Report, [4]byte{239, 129, 2, 3}))
	if !ok || mac != [6]byte{1, 0, 0x5e, 0, 0, 22} {
		t.Fatalf("multicast MAC %x", mac)
	}
}

// FuzzIPInspect: the header inspection helpers never panic on host or
// wire bytes, and the report parser either acts on a whole message of
// multicast groups of the packet's family or on nothing.
func FuzzIPInspect(f *testing.F) {
	f.Add(buildIGMPv2([4]byte{224, 0, 0, 5}))
	f.Add(buildIGMPv3(v2Record{typ: recChangeToExclude, group: netip.MustParseAddr("239.1.1.1"), sources: 1}))
	f.Add(buildMLDv2(netip.MustParseAddr("ff02::1:ff00:1")))
	f.Add(buildMLDv1(mldV1Done, netip.MustParseAddr("ff05::1")))
	f.Add([]byte{0x45})
	eth := make([]byte, 14, 14+65536)
	f.Fuzz(func(t *testing.T, p []byte) {
		// The RX path's one reading of a frame's headers checks as the
		// helpers do.
		h, ip, _ := offload.ReadHeaders(append(eth[:14], p...), 14)
		if v4, v6 := validIPv4(p), validIPv6(p); validRead(0x0800, &h, ip) != v4 || validRead(0x86DD, &h, ip) != v6 {
			t.Fatalf("validRead %+v %v against validIPv4 %v, validIPv6 %v", h, ip, v4, v6)
		}
		ipv4Dst(p)
		ipv6Src(p)
		ipv6Dst(p)
		ipSrc(0x0800, p)
		ipSrc(0x86DD, p)
		hostMulticastMAC(0x0800, p)
		hostMulticastMAC(0x86DD, p)
		isIPv4Broadcast(p)
		for _, et := range []uint16{0x0800, 0x86DD} {
			pre := []mcastChange{{}}
			got, v := parseMcastReport(et, p, pre)
			if v != mcastReport && len(got) != 1 {
				t.Fatalf("verdict %v but %d changes", v, len(got)-1)
			}
			for _, c := range got[1:] {
				if !c.group.IsMulticast() || c.group.Is4() != (et == 0x0800) {
					t.Fatalf("group %v from ethertype %#x", c.group, et)
				}
			}
		}
		parseCMPrivateData(p)
	})
}

func TestPSNSourceRandomUnlessSeeded(t *testing.T) {
	a, b := newPSNSource(0).next(), newPSNSource(0).next()
	c, d := newPSNSource(0).next(), newPSNSource(0).next()
	if a == b && b == c && c == d {
		t.Fatalf("seed 0 gave the same first draw four times: %#x", a)
	}
	if newPSNSource(7).next() != newPSNSource(7).next() {
		t.Fatal("a fixed seed is not reproducible")
	}
}
