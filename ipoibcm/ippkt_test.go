package ipoibcm

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

func buildIGMPv2(group [4]byte) []byte {
	p := make([]byte, 24+8)
	p[0] = 0x46 // IHL 6: Router Alert option
	binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
	p[8], p[9] = 1, ipProtoIGMP
	copy(p[16:20], group[:])
	m := p[24:]
	m[0] = igmpV2Report
	copy(m[4:8], group[:])
	return p
}

func buildMLDv2(groups ...netip.Addr) []byte {
	body := 8 + 20*len(groups)
	p := make([]byte, 40+8+body)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(8+body))
	p[6], p[7] = ipv6HopByHop, 1
	p[40] = ipProtoICMPv6 // hop-by-hop: next header, length 0 (8 bytes)
	m := p[48:]
	m[0] = mldV2Report
	binary.BigEndian.PutUint16(m[6:8], uint16(len(groups)))
	for k, g := range groups {
		r := m[8+20*k:]
		r[0] = 4 // CHANGE_TO_EXCLUDE: join
		a := g.As16()
		copy(r[4:20], a[:])
	}
	return p
}

func TestMulticastReportParsing(t *testing.T) {
	g, ok := igmpReportGroups(buildIGMPv2([4]byte{239, 1, 2, 3}), nil)
	if !ok || len(g) != 1 || g[0] != netip.MustParseAddr("239.1.2.3") {
		t.Fatalf("IGMPv2: %v %v", g, ok)
	}
	want := []netip.Addr{netip.MustParseAddr("ff02::1:ff00:2"), netip.MustParseAddr("ff05::9")}
	g, ok = mldReportGroups(buildMLDv2(want...), nil)
	if !ok || len(g) != 2 || g[0] != want[0] || g[1] != want[1] {
		t.Fatalf("MLDv2: %v %v", g, ok)
	}
	if _, ok := igmpReportGroups(make([]byte, 40), nil); ok {
		t.Fatal("garbage accepted as IGMP")
	}
	if sn := solicitedNode(netip.MustParseAddr("fd00::1:2:3")); sn != netip.MustParseAddr("ff02::1:ff02:3") {
		t.Fatalf("solicited-node = %v", sn)
	}
	mac, ok := hostMulticastMAC(0x0800, buildIGMPv2([4]byte{239, 129, 2, 3}))
	if !ok || mac != [6]byte{1, 0, 0x5e, 1, 2, 3} {
		t.Fatalf("multicast MAC %x", mac)
	}
}

// FuzzIPInspect: the header inspection helpers never panic on host or
// wire bytes.
func FuzzIPInspect(f *testing.F) {
	f.Add(buildIGMPv2([4]byte{224, 0, 0, 5}))
	f.Add(buildMLDv2(netip.MustParseAddr("ff02::1:ff00:1")))
	f.Add([]byte{0x45})
	f.Fuzz(func(t *testing.T, p []byte) {
		validIPv4(p)
		validIPv6(p)
		ipv4Dst(p)
		ipv6Src(p)
		ipv6Dst(p)
		ipSrc(0x0800, p)
		ipSrc(0x86DD, p)
		hostMulticastMAC(0x0800, p)
		hostMulticastMAC(0x86DD, p)
		isIPv4Broadcast(p)
		if g, ok := igmpReportGroups(p, nil); ok {
			for _, a := range g {
				if !a.Is4() {
					t.Fatalf("IGMP group %v", a)
				}
			}
		}
		if g, ok := mldReportGroups(p, nil); ok {
			for _, a := range g {
				if !a.Is6() {
					t.Fatalf("MLD group %v", a)
				}
			}
		}
		parseCMPrivateData(p)
	})
}

func TestPSNSourceRandomUnlessSeeded(t *testing.T) {
	a, b := newPSNSource(0).Uint32(), newPSNSource(0).Uint32()
	c, d := newPSNSource(0).Uint32(), newPSNSource(0).Uint32()
	if a == b && b == c && c == d {
		t.Fatalf("seed 0 gave the same first draw four times: %#x", a)
	}
	if newPSNSource(7).Uint32() != newPSNSource(7).Uint32() {
		t.Fatal("a fixed seed is not reproducible")
	}
}
