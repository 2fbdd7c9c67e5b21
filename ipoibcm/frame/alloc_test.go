package frame

import (
	"net/netip"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// The engine calls these on its data and control paths with preallocated
// buffers; none may allocate, including on the drop (error) path.
func TestZeroAllocs(t *testing.T) {
	frame := make([]byte, 1514)
	PutEthernet(frame, EthHeader{Dst: LocalMAC(1), Src: LocalMAC(2), EtherType: EtherTypeIPv4})
	vlan := make([]byte, 60)
	PutEthernet(vlan, EthHeader{EtherType: 0x8100})
	arpBody := mustHex(t, frame4ARP)
	ethARP := make([]byte, EthARPLen)
	(&EthARP{ARP: ARP{Op: ARPReply, SenderIP: netip.MustParseAddr("192.0.2.9")}}).Marshal(ethARP)
	ns := ndCases()[0].eth
	nsIB := ndCases()[0].ib
	v4 := ipv4Packet(3000, header.IPv4FlagDontFragment, 0, uint8(header.UDPProtocolNumber), "192.0.2.1", "192.0.2.2")
	v6 := ipv6Packet(3000, uint8(header.UDPProtocolNumber), "2001:db8::1", "2001:db8::2")
	out := make([]byte, 2048)
	group := netip.MustParseAddr("ff02::1:ff00:2")
	macOf := func(HWAddr) (MAC, bool) { return testHostMC, true }
	var sink int

	for _, c := range []struct {
		name string
		f    func()
	}{
		{"ParseEthernet", func() { h, _ := ParseEthernet(frame); sink += int(h.EtherType) }},
		{"ParseEthernet VLAN drop", func() { _, err := ParseEthernet(vlan); sink += btoi(err != nil) }},
		{"PutEthernet", func() { PutEthernet(out, EthHeader{EtherType: EtherTypeIPv6}) }},
		{"PutEncap", func() { PutEncap(out, EtherTypeIPv4) }},
		{"ParseEncap", func() { et, _ := ParseEncap(frame); sink += int(et) }},
		{"ParseIPoIBARP+Marshal", func() { a, _ := ParseIPoIBARP(arpBody); sink += a.Marshal(out) }},
		{"ParseEthARP+Marshal", func() { a, _ := ParseEthARP(ethARP); sink += a.Marshal(out) }},
		{"IsND", func() { sink += btoi(IsND(ns)) }},
		{"NDToIPoIB", func() { n, _, _ := NDToIPoIB(out, ns, testOwnHW); sink += n }},
		{"NDToEthernet", func() { n, _, _ := NDToEthernet(out, nsIB, macOf); sink += n }},
		{"BuildTooBig IPv4", func() { sink += BuildTooBig(out, testTapMAC, testPeerMAC, v4, 2044) }},
		{"BuildTooBig IPv6", func() { sink += BuildTooBig(out, testTapMAC, testPeerMAC, v6, 2044) }},
		{"MulticastHWAddr", func() { a := MulticastHWAddr(group, hca.PKeyDefault); sink += int(a[19]) }},
		{"NewHWAddr", func() { a := NewHWAddr(FlagRC, 0x48, hca.GID{}); sink += int(a.QPN()) }},
	} {
		if avg := testing.AllocsPerRun(100, c.f); avg != 0 {
			t.Errorf("%s: %v allocs per call", c.name, avg)
		}
	}
	if sink == 0 {
		t.Fatal("calls produced nothing")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func BenchmarkNDToIPoIB(b *testing.B) {
	ns := ndCases()[0].eth
	out := make([]byte, 256)
	b.SetBytes(int64(len(ns)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := NDToIPoIB(out, ns, testOwnHW); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuildTooBigIPv4(b *testing.B) {
	v4 := ipv4Packet(3000, header.IPv4FlagDontFragment, 0, uint8(header.UDPProtocolNumber), "192.0.2.1", "192.0.2.2")
	out := make([]byte, 2048)
	b.SetBytes(EthHdrLen + icmpv4MaxErrorLen)
	b.ReportAllocs()
	for b.Loop() {
		if BuildTooBig(out, testTapMAC, testPeerMAC, v4, 2044) == 0 {
			b.Fatal("no frame")
		}
	}
}

func BenchmarkParseIPoIBARP(b *testing.B) {
	body := mustHex(b, frame4ARP)
	b.SetBytes(IPoIBARPLen)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseIPoIBARP(body); err != nil {
			b.Fatal(err)
		}
	}
}
